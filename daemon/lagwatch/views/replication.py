"""pg_stat_replication on the primary: one row per walsender, a physical replica's or a
logical consumer's (a subscription, a change-data-capture client on a logical slot); the
two are told apart by the slot each streams from and kept apart (``Senders``).

Read through the functions under the view: ``pg_stat_get_wal_senders()`` every cycle,
and the sessions' ``application_name`` and ``client_addr`` only for walsenders not seen
before on this connection (``NAMES_SQL``; ``SenderNames`` remembers them). The view joins
``pg_stat_get_activity(NULL)``, which copies every session's status and builds a row for
each: on a primary with 300 sessions a poll cost its backend ~1.1 ms instead of ~0.1, for
two names that do not change while a walsender lives (a physical walsender runs no SQL,
so it cannot set them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from lagwatch.fastinit import fast_init
from lagwatch.lsn import parse_lsn
from lagwatch.views.base import Row, View, opt_float

# What the view shows, less what the walsender functions do not know (the names), read
# each cycle. Without pg_read_all_stats every column but the pid is NULL, as in the view.
QUERIES = {
    130000: """SELECT w.pid, w.state, w.sync_state,
    w.sent_lsn::text AS sent_lsn, w.write_lsn::text AS write_lsn,
    w.flush_lsn::text AS flush_lsn, w.replay_lsn::text AS replay_lsn,
    pg_current_wal_lsn()::text AS current_lsn,
    extract(epoch FROM w.write_lag)::float8 AS write_lag,
    extract(epoch FROM w.flush_lag)::float8 AS flush_lag,
    extract(epoch FROM w.replay_lag)::float8 AS replay_lag,
    s.slot_name, s.slot_type
FROM pg_stat_get_wal_senders() w
LEFT JOIN pg_replication_slots s ON s.active_pid = w.pid
-- A base backup's walsenders are not replicas (pg_basebackup by its name: parse). state is
-- NULL to a role without pg_read_all_stats: such rows stay.
WHERE w.state IS DISTINCT FROM 'backup'
ORDER BY w.pid""",
}

# The names of walsenders this connection has not seen yet (psycopg parameters).
NAMES_SQL = b"""SELECT a.pid, a.application_name, a.client_addr::text AS client_addr
FROM unnest(%s::int[]) p, LATERAL pg_stat_get_activity(p) a"""


class SenderNames:
    """The ``application_name`` and ``client_addr`` of the walsenders one connection has
    seen, by pid. A pid is forgotten as soon as a cycle no longer shows it, so a pid the
    kernel hands to a later walsender is looked up again (reuse within one interval would
    need the pid space to wrap around in that time). Pure: the poller does the reading."""

    def __init__(self) -> None:
        self._names: dict[int, tuple[str | None, str | None]] = {}

    def forget(self) -> None:
        """A cycle that did not read the walsenders: what happens meanwhile is not seen."""
        self._names.clear()

    def missing(self, rows: Sequence[Row]) -> list[int]:
        """The pids in ``rows`` (the cycle's walsenders) whose names are not known yet."""
        return [row["pid"] for row in rows if row["pid"] not in self._names]

    def learn(self, rows: Sequence[Row]) -> None:
        """``NAMES_SQL``'s answer. A walsender gone before its name was read has no row: it
        stays unnamed this cycle and is asked for again next cycle if it is still there."""
        for row in rows:
            self._names[row["pid"]] = (row["application_name"], row["client_addr"])

    def named(self, rows: Sequence[Row]) -> list[dict[str, Any]]:
        """``rows`` with their names, as the view would show them; forgets pids not in them.
        A walsender whose name was not found has gone (every live one has a session): as in
        the view, which joins the two, it has no row."""
        names = self._names
        seen = {row["pid"] for row in rows}
        for pid in [pid for pid in names if pid not in seen]:
            del names[pid]
        out = []
        for row in rows:
            known = names.get(row["pid"])
            if known is not None:
                out.append({**row, "application_name": known[0], "client_addr": known[1]})
        return out


STAGES = ("sent", "write", "flush", "replay")


@fast_init
@dataclass(frozen=True)
class WalSender:
    application_name: str
    client_addr: str | None
    state: str | None
    sync_state: str | None
    slot_name: str | None
    current_lsn: int
    sent_lsn: int | None
    write_lsn: int | None
    flush_lsn: int | None
    replay_lsn: int | None
    write_lag: float | None
    flush_lag: float | None
    replay_lag: float | None

    def lsn(self, stage: str) -> int | None:
        value: int | None = getattr(self, f"{stage}_lsn")
        return value

    def lag_bytes(self, stage: str) -> int | None:
        """Primary's current LSN minus the replica's position at ``stage``."""
        lsn = self.lsn(stage)
        return None if lsn is None else max(0, self.current_lsn - lsn)

    def lag_seconds(self, stage: str) -> float | None:
        """write/flush/replay_lag, where NULL means 'caught up and idle' once the stage
        has reached what was sent (PostgreSQL clears them when nothing is in flight)."""
        value: float | None = getattr(self, f"{stage}_lag")
        if value is not None:
            return value
        lsn = self.lsn(stage)
        if lsn is not None and self.sent_lsn is not None and lsn >= self.sent_lsn:
            return 0.0
        return None


@fast_init
@dataclass(frozen=True)
class LogicalSender:
    """A logical walsender: a subscription's apply worker or a change-data-capture client
    (pg_recvlogical, Debezium) streaming decoded changes from its slot. Not a read replica:
    what it confirms is a position in the primary's WAL, not a copy of it."""

    application_name: str  # a subscription's name; the client's own otherwise
    slot_name: str
    state: str | None  # startup | catchup | streaming | stopping
    current_lsn: int
    sent_lsn: int | None  # how far it has decoded
    flush_lsn: int | None  # what the consumer confirmed as durable (the slot's confirmed_flush follows it)
    replay_lsn: int | None  # a subscription's: the end of the last transaction it applied (NULL from most CDC clients)

    @property
    def position(self) -> int | None:
        """How far what it has done reaches: the later of its applied and its confirmed
        positions (a subscription applies before its own WAL flush confirms; pg_recvlogical
        and most CDC clients report no apply position at all)."""
        known = [p for p in (self.replay_lsn, self.flush_lsn) if p is not None]
        return max(known) if known else None


def logical_key(slot_name: str) -> str:
    """A logical consumer's dates among the replicas' (commitscan.py keys those by
    application_name): a key no application_name can be (it holds no NUL)."""
    return "\0logical:" + slot_name


class Senders(NamedTuple):
    physical: tuple[WalSender, ...]
    logical: tuple[LogicalSender, ...]


def parse_all(rows: Sequence[Row]) -> Senders:
    """The view's rows split: read replicas (``parse``) and logical consumers, by slot."""
    logical = []
    for row in rows:
        if row.get("slot_type") != "logical" or row["slot_name"] is None:
            continue
        current = parse_lsn(row["current_lsn"])
        assert current is not None
        logical.append(LogicalSender(row["application_name"] or "", row["slot_name"], row["state"], current,
                                     parse_lsn(row["sent_lsn"]), parse_lsn(row["flush_lsn"]),
                                     parse_lsn(row["replay_lsn"])))
    return Senders(parse(rows), tuple(sorted(logical, key=lambda s: s.slot_name)))


def parse(rows: Sequence[Row]) -> tuple[WalSender, ...]:
    """Named rows (``SenderNames.named``), one WalSender per name, ordered by name: the
    physical walsenders (a logical one streams from a logical slot)."""
    senders: dict[str, WalSender] = {}
    for row in sorted(rows, key=_by_name_then_pid):
        if row.get("slot_type") == "logical":
            continue
        if row["application_name"] is None and row["state"] is None:
            continue  # without pg_read_all_stats and unnamed: nothing to tell
        name = row["application_name"] or ""
        if name == "pg_basebackup":
            continue  # a base backup's WAL stream, not a replica
        if name in senders:  # two walsenders with one name: keep the first (ordered by pid)
            continue
        current = parse_lsn(row["current_lsn"])
        assert current is not None
        senders[name] = WalSender(
            application_name=name,
            client_addr=row["client_addr"],
            state=row["state"],
            sync_state=row["sync_state"],
            slot_name=row["slot_name"],
            current_lsn=current,
            sent_lsn=parse_lsn(row["sent_lsn"]),
            write_lsn=parse_lsn(row["write_lsn"]),
            flush_lsn=parse_lsn(row["flush_lsn"]),
            replay_lsn=parse_lsn(row["replay_lsn"]),
            write_lag=opt_float(row["write_lag"]),
            flush_lag=opt_float(row["flush_lag"]),
            replay_lag=opt_float(row["replay_lag"]),
        )
    return tuple(senders.values())


def _by_name_then_pid(row: Mapping[str, Any]) -> tuple[str, int]:
    return row["application_name"] or "", row.get("pid") or 0


VIEW = View("replication", frozenset({"primary"}), QUERIES, parse_all)
