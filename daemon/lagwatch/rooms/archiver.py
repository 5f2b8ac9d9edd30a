"""WAL archiving: ``pg_stat_archiver`` and the segments waiting in ``pg_wal/archive_status``.

A failing or slow ``archive_command`` (or ``archive_library``, 15+) keeps WAL in ``pg_wal``
exactly as a stuck slot does, and breaks point-in-time recovery and every replica fed from
the archive. Read on the servers that archive: the primary with ``archive_mode`` ``on`` or
``always``, a standby only with ``always`` (with ``on`` a standby does not archive: it is
not read, and nothing of it can alert). ``archive_mode`` needs a restart to change, so the
probe asks it once per connection.

Per node: WAL files archived and failed (counted across ``stats_reset``, so the counters
only grow), the last archived and failed files and their ages, and the segments waiting
(``.ready`` files, ``pg_ls_archive_statusdir()``, with EXECUTE granted) with the oldest's
age: the ages on the server's own clock (``now()`` against its times). The function gives a
file's time in whole seconds (its ``st_mtime``), so the oldest's wait reads up to a second
more than it waited, never less. ``archive_mode`` on
with neither an ``archive_command`` nor an ``archive_library`` is said plainly: WAL piles up
and no failure is ever counted (the waiting segments show it). Whether a command is set is
read from ``pg_settings``, which hides it from a role without pg_read_all_settings: then
unknown, never guessed.

The alerts (alerts/lagwatch.rules.yml) page on failures growing while segments wait, and
warn on the waiting segments' count and the oldest one's age: never on the last archived
file's age, which grows harmlessly on an idle primary with ``archive_timeout = 0``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lagwatch.fastinit import fast_init
from lagwatch.render import families as f
from lagwatch.render.html import dur, esc
from lagwatch.rooms.base import Cycle, Grant, Room
from lagwatch.views.base import Row, View, opt_float, opt_int
from lagwatch.views.probe import Capabilities

_STATUSDIR = "pg_ls_archive_statusdir()"

# The view's SQL, 13+ (pg_ls_archive_statusdir is 12+, archive_library 15+: pg_settings
# simply has no such row before). The waiting segments are listed where the probe found the
# grant (once per connection: GRANTS); where it did not, the statement has no such call at
# all and they are NULL (unknown). Where it did, the call is still guarded: a grant revoked
# while the connection lasts (the probe does not run again) then costs the waiting segments,
# never the whole view, whose failure counts are what the paging alert reads.
_COUNTERS = """SELECT current_setting('archive_mode') AS mode,
    (SELECT bool_or(setting <> '') FROM pg_settings WHERE name IN ('archive_command', 'archive_library'))
        AS configured,
    a.archived_count AS archived, a.failed_count AS failed,
    a.last_archived_wal, extract(epoch FROM now() - a.last_archived_time)::float8 AS last_archived_age,
    a.last_failed_wal, extract(epoch FROM now() - a.last_failed_time)::float8 AS last_failed_age,
    extract(epoch FROM a.stats_reset)::float8 AS stats_reset"""
QUERIES = {130000: f"""{_COUNTERS},
    CASE WHEN has_function_privilege('{_STATUSDIR}', 'EXECUTE') THEN
        (SELECT json_build_object('count', count(*),
                                  'oldest_age', extract(epoch FROM now() - min(modification))::float8)
         FROM {_STATUSDIR} WHERE name LIKE '%.ready') END AS waiting
FROM pg_stat_archiver a"""}
WITHOUT_STATUSDIR = {130000: f"""{_COUNTERS},
    NULL::json AS waiting
FROM pg_stat_archiver a"""}


@fast_init
@dataclass(frozen=True)
class ArchiverReading:
    """One node's archiver, as one poll read it."""

    mode: str  # archive_mode: on | always
    configured: bool | None  # an archive_command or archive_library is set (None: hidden from this role)
    archived: int  # since stats_reset
    failed: int
    last_archived_wal: str | None
    last_archived_age: float | None  # seconds, on the server's clock
    last_failed_wal: str | None
    last_failed_age: float | None
    stats_reset: float | None  # epoch seconds
    waiting: int | None  # segments waiting to be archived (None: no EXECUTE on pg_ls_archive_statusdir)
    oldest_waiting_age: float | None  # seconds since the oldest of them was ready (None: none waits)

    @property
    def unconfigured(self) -> bool:
        """archive_mode is on, and nothing archives: WAL piles up with no failure counted."""
        return self.configured is False


def parse(rows: Sequence[Row]) -> ArchiverReading:
    (row,) = rows  # pg_stat_archiver has one row
    waiting = row.get("waiting")
    return ArchiverReading(
        mode=str(row["mode"]), configured=row.get("configured"), archived=int(row["archived"]),
        failed=int(row["failed"]), last_archived_wal=row.get("last_archived_wal"),
        last_archived_age=opt_float(row.get("last_archived_age")), last_failed_wal=row.get("last_failed_wal"),
        last_failed_age=opt_float(row.get("last_failed_age")), stats_reset=opt_float(row.get("stats_reset")),
        waiting=None if waiting is None else opt_int(waiting.get("count")),
        oldest_waiting_age=None if waiting is None else opt_float(waiting.get("oldest_age")))


def applies(caps: Capabilities) -> bool:
    """A primary archives with archive_mode on or always; a standby only with always."""
    mode = caps.asked.get("archive_mode")
    return mode == "always" or (mode == "on" and not caps.in_recovery)


GRANTS = (Grant("archive_status", f"has_function_privilege('{_STATUSDIR}', 'EXECUTE')",
                f"GRANT EXECUTE ON FUNCTION {_STATUSDIR} TO ROLE",
                reads="the segments waiting to be archived (pg_wal/archive_status)"),)


def queries_for(caps: Capabilities) -> dict[int, str]:
    """The segments waiting are listed only where the probe found the grant."""
    return QUERIES if caps.asked.get(GRANTS[0].name) else WITHOUT_STATUSDIR


VIEW = View("archiver", frozenset({"primary", "replica"}), QUERIES, parse, applies=applies,
            queries_for=queries_for)


@dataclass(frozen=True)
class NodeArchiving:
    node: str
    reading: ArchiverReading
    archived_total: int  # across stats_reset: only grows
    failed_total: int


class _Totals:
    """A node's counts across ``stats_reset`` (pg_stat_reset_shared('archiver') zeroes them)."""

    def __init__(self) -> None:
        self.reset: float | None = None
        self.last = (0, 0)  # (archived, failed) as last read
        self.before = (0, 0)  # counted before the last reset

    def add(self, r: ArchiverReading) -> tuple[int, int]:
        if r.stats_reset != self.reset or r.archived < self.last[0] or r.failed < self.last[1]:
            if self.reset is not None or self.last != (0, 0):  # a reset seen, not the first reading
                self.before = (self.before[0] + self.last[0], self.before[1] + self.last[1])
            self.reset = r.stats_reset
        self.last = (r.archived, r.failed)
        return self.before[0] + r.archived, self.before[1] + r.failed


class ArchiverKeeper:
    """One cluster's archiving nodes across cycles: their counts, across statistics resets."""

    def __init__(self) -> None:
        self._totals: dict[str, _Totals] = {}

    def update(self, readings: Mapping[str, ArchiverReading], cycle: Cycle) -> tuple[NodeArchiving, ...] | None:
        if not readings:
            return None
        out = []
        for node, reading in sorted(readings.items()):
            archived, failed = self._totals.setdefault(node, _Totals()).add(reading)
            out.append(NodeArchiving(node, reading, archived, failed))
        return tuple(out)

    def forget(self, node: str) -> None:
        self._totals.pop(node, None)


# -- what it exports ------------------------------------------------------------------------
_SECTION = "WAL archiving"
C, N = "cluster", "node"
ARCHIVED = f.counter("lagwatch_archive_archived", "WAL files the node's archiver has archived, counted across "
                     "statistics resets (pg_stat_archiver)", C, N, section=_SECTION)
FAILED = f.counter("lagwatch_archive_failed", "Failed attempts to archive a WAL file, counted across statistics "
                   "resets (pg_stat_archiver)", C, N, section=_SECTION)
WAITING = f.gauge("lagwatch_archive_waiting_segments", "WAL segments waiting to be archived (.ready files in "
                  "pg_wal/archive_status; absent without EXECUTE on pg_ls_archive_statusdir())", C, N,
                  section=_SECTION)
OLDEST = f.gauge("lagwatch_archive_oldest_waiting_age_seconds", "How long the oldest segment waiting to be archived "
                 "has waited, on the server's clock, up to 1 s more (its file's time is whole seconds); 0 when none "
                 "waits", C, N, section=_SECTION)
LAST_ARCHIVED_AGE = f.gauge("lagwatch_archive_last_archived_age_seconds", "Since the last WAL file was archived, on "
                            "the server's clock (grows on an idle primary with archive_timeout = 0: not an alert)",
                            C, N, section=_SECTION)
LAST_FAILED_AGE = f.gauge("lagwatch_archive_last_failure_age_seconds", "Since the last failed attempt to archive, on "
                          "the server's clock (absent if none since the statistics were reset)", C, N,
                          section=_SECTION)
UNCONFIGURED = f.gauge("lagwatch_archive_unconfigured", "1 if archive_mode is on but neither archive_command nor "
                       "archive_library is set: WAL piles up in pg_wal and no failure is counted (absent when "
                       "pg_settings hides them from this role)", C, N, section=_SECTION)
MODE = f.info("lagwatch_archive", "The node's archive_mode (on: the primary archives; always: a standby archives "
              "too)", C, N, "mode", section=_SECTION)
FAMILIES = (ARCHIVED, FAILED, WAITING, OLDEST, LAST_ARCHIVED_AGE, LAST_FAILED_AGE, UNCONFIGURED, MODE)


def export(cluster: str, nodes: tuple[NodeArchiving, ...]) -> None:
    for n in nodes:
        key, r = [cluster, n.node], n.reading
        ARCHIVED.add(key, n.archived_total)
        FAILED.add(key, n.failed_total)
        MODE.make().add_metric([*key, r.mode])
        if r.waiting is not None:
            WAITING.add(key, r.waiting)
            OLDEST.add(key, r.oldest_waiting_age or 0.0)
        if r.last_archived_age is not None:
            LAST_ARCHIVED_AGE.add(key, r.last_archived_age)
        if r.last_failed_age is not None:
            LAST_FAILED_AGE.add(key, r.last_failed_age)
        if r.configured is not None:
            UNCONFIGURED.add(key, float(r.unconfigured))


# -- what it shows ----------------------------------------------------------------------------
def status(nodes: tuple[NodeArchiving, ...] | None) -> list[dict[str, Any]] | None:
    """/api/status's "archiver": one entry per node that archives (null: none read)."""
    if nodes is None:
        return None
    return [{"node": n.node, "archive_mode": n.reading.mode, "configured": n.reading.configured,
             "archived_total": n.archived_total, "failed_total": n.failed_total,
             "last_archived_wal": n.reading.last_archived_wal, "last_archived_age_seconds": n.reading.last_archived_age,
             "last_failed_wal": n.reading.last_failed_wal, "last_failed_age_seconds": n.reading.last_failed_age,
             "waiting_segments": n.reading.waiting, "oldest_waiting_age_seconds": n.reading.oldest_waiting_age,
             "failing": failing(n)} for n in nodes]


def failing(n: NodeArchiving) -> bool:
    """The last attempt failed and segments still wait (the alert's condition, as one poll sees it)."""
    r = n.reading
    return bool(r.waiting) and r.last_failed_age is not None and (
        r.last_archived_age is None or r.last_failed_age < r.last_archived_age)


def page(nodes: tuple[NodeArchiving, ...] | None) -> str:
    """The /status line: per node, archived and failed, what waits, and why it is bad."""
    if not nodes:
        return ""
    parts = []
    for n in nodes:
        r = n.reading
        text = f"{esc(n.node)}: {n.archived_total} archived, {n.failed_total} failed"
        if r.waiting is not None:
            text += f", {r.waiting} waiting" + (f" (oldest {esc(dur(r.oldest_waiting_age))})" if r.waiting else "")
        if r.unconfigured:
            text += ' — <span class="bad">archive_mode is on but nothing archives (no archive_command)</span>'
        elif failing(n):
            text += (f' — <span class="bad">failing: {esc(r.last_failed_wal or "?")} '
                     f"{esc(dur(r.last_failed_age))} ago</span>")
        parts.append(text)
    return f'<div class="meta archiver">WAL archiving: {"; ".join(parts)}</div>'


ROOM = Room(VIEW, FAMILIES, ArchiverKeeper, export, status, page,
            probe={"archive_mode": "current_setting('archive_mode')"}, grants=GRANTS)
