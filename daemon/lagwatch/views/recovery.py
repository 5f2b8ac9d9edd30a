"""A replica's replay, from inside: what its startup process (the one process that replays)
is doing, which sessions hold it when it waits on a query, the conflicts it has cancelled
queries over, and how much it reads.

The startup process is read by its pid (``pg_stat_get_activity(pid)``): the pid is found
once per connection by the probe (views/probe.py), which keeps it in the session setting
``lagwatch.startup_pid``, so a cycle does not build a row for every session on the replica
(``pg_stat_activity`` does). Without the setting (a pooler in between dropped it) the
function lists every session and the startup one is picked out: right, only dearer. The
sessions are listed only while replay waits on a conflict; their query text only where the
operator turns ``conflict_query_text`` on.

Read with pg_read_all_stats only: without it the startup process's wait event is hidden
(NULL), which would read as "working".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from lagwatch.fastinit import fast_init
from lagwatch.views.base import Row, View, opt_float, opt_int

if TYPE_CHECKING:
    from lagwatch.views.probe import Capabilities  # the probe reads the startup pid this view uses

STARTUP_PID_SETTING = "lagwatch.startup_pid"
# Set in every replica session to 'on' where the operator turns conflict_query_text on, else
# 'off' (poll.py): never left to what the role's or database's settings say.
QUERY_TEXT_SETTING = "lagwatch.conflict_queries"

# The probe's column that keeps the startup pid in the session (a replica's; NULL on a primary).
PROBE_COLUMN = f"""CASE WHEN pg_is_in_recovery() THEN set_config('{STARTUP_PID_SETTING}',
        coalesce((SELECT pid FROM pg_stat_activity WHERE backend_type = 'startup')::text, ''), false)
    END AS startup_pid"""

# pg_stat_database_conflicts' columns by type, from the version that has them.
CONFLICT_TYPES: dict[str, int] = {"snapshot": 130000, "lock": 130000, "bufferpin": 130000,
                                  "tablespace": 130000, "deadlock": 130000, "active_logicalslot": 160000}

# The startup process's wait events that mean replay waits on a query (a hot-standby
# conflict), by the conflict type pg_stat_database_conflicts counts it under when the
# query is cancelled. A wait of type Lock (any lock) is a lock conflict.
CONFLICT_WAITS = {"RecoveryConflictSnapshot": "snapshot", "RecoveryConflictTablespace": "tablespace",
                  "BufferPin": "bufferpin", "ReplicationSlotDrop": "active_logicalslot"}
# Waits for more WAL to replay: replay has nothing to do (RestoreCommand: the archive's
# restore_command fetching the next file, which can take seconds).
WAL_WAITS = frozenset({"RecoveryWalStream", "RecoveryWalAll", "RecoveryRetrieveRetryInterval", "RestoreCommand"})
# Waits that are replay's own work: reading and writing data and WAL, a buffer's lock.
WORK_WAIT_TYPES = frozenset({"IO", "LWLock"})


def _conflicts_sql(version: int) -> str:
    return ", ".join(f"sum(confl_{t})::int8 AS confl_{t}" for t, since in CONFLICT_TYPES.items() if since <= version)


# The sessions granted a lock on what the startup process waits to lock. pg_blocking_pids()
# cannot say: it looks the waiter up among the backends, and the startup process is not one.
_LOCK_HOLDERS = """SELECT h.pid FROM pg_locks w JOIN pg_locks h ON h.granted AND h.pid <> w.pid
                AND (h.locktype, h.database, h.relation, h.page, h.tuple, h.virtualxid, h.transactionid,
                     h.classid, h.objid, h.objsubid)
                    IS NOT DISTINCT FROM (w.locktype, w.database, w.relation, w.page, w.tuple, w.virtualxid,
                                          w.transactionid, w.classid, w.objid, w.objsubid)
                WHERE w.pid = s.pid AND NOT w.granted"""


def _sql(version: int) -> str:
    return f"""WITH startup AS MATERIALIZED (
    SELECT pid, wait_event_type, wait_event
    FROM pg_stat_get_activity(nullif(current_setting('{STARTUP_PID_SETTING}', true), '')::int)
    WHERE backend_type = 'startup')
SELECT s.pid AS startup_pid, s.wait_event_type, s.wait_event,
    -- Who holds replay, only while it waits on a query: a lock's holders exactly; for a
    -- snapshot, a buffer pin or a tablespace, the sessions that hold a snapshot, oldest first.
    CASE WHEN s.wait_event_type = 'Lock' OR s.wait_event IN ({", ".join(f"'{w}'" for w in CONFLICT_WAITS)}) THEN
        (SELECT coalesce(json_agg(h), '[]'::json) FROM (
            SELECT a.pid, a.usename AS "user", a.state,
                extract(epoch FROM clock_timestamp() - a.xact_start)::float8 AS xact_age,
                CASE WHEN current_setting('{QUERY_TEXT_SETTING}', true) = 'on' THEN left(a.query, 200) END AS query
            FROM pg_stat_activity a
            WHERE a.backend_type = 'client backend' AND a.xact_start IS NOT NULL AND a.pid <> pg_backend_pid()
              AND CASE WHEN s.wait_event_type = 'Lock' THEN a.pid IN ({_LOCK_HOLDERS})
                       ELSE a.backend_xmin IS NOT NULL END
            ORDER BY a.xact_start LIMIT 5) h)
    END AS holders,
    c.*,
    extract(epoch FROM current_setting('max_standby_streaming_delay')::interval)::float8 AS max_streaming_delay,
    extract(epoch FROM current_setting('max_standby_archive_delay')::interval)::float8 AS max_archive_delay,
    -- restore_command is shown to pg_read_all_settings only (it may hold credentials).
    CASE WHEN pg_has_role('pg_read_all_settings', 'USAGE') THEN current_setting('restore_command') <> '' END
        AS restore_command_set
FROM (SELECT {_conflicts_sql(version)} FROM pg_stat_database_conflicts) c
LEFT JOIN startup s ON true"""


QUERIES = {v: _sql(v) for v in (130000, 160000)}


@fast_init
@dataclass(frozen=True)
class Holder:
    """A session on the replica that may hold replay back (its query only with conflict_query_text)."""

    pid: int
    user: str | None
    state: str | None
    xact_age: float | None  # seconds its transaction has been open
    exact: bool  # it holds the lock replay waits for (else: it holds a snapshot, a candidate)
    query: str | None = None  # its first 200 characters, only with conflict_query_text on


@fast_init
@dataclass(frozen=True)
class Recovery:
    startup_pid: int | None  # None: no startup process seen (promoted, or hidden)
    wait_event_type: str | None
    wait_event: str | None
    holders: tuple[Holder, ...] = ()
    conflicts: Mapping[str, int] = field(default_factory=dict)  # cancelled queries by type, since stats reset
    # Blocks the startup process has read (pg_stat_io, 16+): views/startup_io.py's, read one
    # poll in ten, set on the polls that read it (poll.py), None on the others.
    startup_reads: int | None = None
    max_streaming_delay: float | None = None  # max_standby_streaming_delay, seconds (-1: wait forever)
    max_archive_delay: float | None = None  # max_standby_archive_delay (WAL from the archive)
    restore_command_set: bool | None = None  # None: hidden from this role

    @property
    def conflict(self) -> str | None:
        """The conflict type replay waits on now (a query holds it), or None."""
        if self.wait_event_type == "Lock":
            return "lock"
        return CONFLICT_WAITS.get(self.wait_event or "")

    @property
    def activity(self) -> str | None:
        """What the startup process does: ``working`` (replaying: on CPU, or in I/O),
        ``waiting_for_wal`` (nothing to replay), ``delayed`` (recovery_min_apply_delay),
        ``paused``, ``conflict``, ``other_wait``; None when it was not seen."""
        if self.startup_pid is None:
            return None
        if self.wait_event in WAL_WAITS:
            return "waiting_for_wal"
        if self.wait_event == "RecoveryApplyDelay":
            return "delayed"
        if self.wait_event == "RecoveryPause":
            return "paused"
        if self.conflict is not None:
            return "conflict"
        if self.wait_event is None or self.wait_event_type in WORK_WAIT_TYPES:
            return "working"  # on a CPU, or in its own I/O or a buffer's lock
        return "other_wait"  # a wait not known to be replay's work: not counted as busy

    @property
    def working_on(self) -> str | None:
        """What a working startup process waits on: ``cpu`` or the wait (``IO/DataFileRead``)."""
        if self.activity != "working":
            return None
        return "cpu" if self.wait_event is None else f"{self.wait_event_type}/{self.wait_event}"


def without_query_text(found: Recovery) -> Recovery:
    """``found`` with no holder's query text (conflict_query_text off)."""
    if all(h.query is None for h in found.holders):
        return found
    return replace(found, holders=tuple(replace(h, query=None) for h in found.holders))


def parse(rows: Sequence[Row]) -> Recovery:
    if not rows:
        return Recovery(None, None, None)
    row = rows[0]
    exact = row.get("wait_event_type") == "Lock"
    holders = tuple(Holder(int(h["pid"]), h.get("user"), h.get("state"), opt_float(h.get("xact_age")), exact,
                           h.get("query")) for h in row.get("holders") or ())
    conflicts = {t: int(row[f"confl_{t}"] or 0) for t in CONFLICT_TYPES if f"confl_{t}" in row}
    return Recovery(
        startup_pid=opt_int(row.get("startup_pid")), wait_event_type=row.get("wait_event_type"),
        wait_event=row.get("wait_event"), holders=holders, conflicts=conflicts,
        max_streaming_delay=opt_float(row.get("max_streaming_delay")),
        max_archive_delay=opt_float(row.get("max_archive_delay")), restore_command_set=row.get("restore_command_set"))


def applies(caps: Capabilities) -> bool:
    """Without pg_read_all_stats the startup process's wait is hidden and would read as
    "working": the view is left out (probe.py says which grant)."""
    return caps.can_read_all_stats


VIEW = View("recovery", frozenset({"replica"}), QUERIES, parse, applies=applies)
