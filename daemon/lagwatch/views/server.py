"""The server's own position: role, timeline, current/receive/replay LSN, replay pause,
replay timestamp, and which server answered.

Read on every node. The LSN functions that only make sense in one role are guarded by
``pg_is_in_recovery()`` so one statement serves both roles (and a failover shows as a
role change, not an error).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lagwatch.fastinit import fast_init
from lagwatch.lsn import parse_lsn
from lagwatch.views.base import Row, View, opt_float, opt_int

_COMMON = """
    pg_is_in_recovery() AS in_recovery,
    CASE WHEN NOT pg_is_in_recovery() THEN pg_current_wal_lsn()::text END AS current_lsn,
    pg_last_wal_receive_lsn()::text AS receive_lsn,
    pg_last_wal_replay_lsn()::text AS replay_lsn,
    extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8
        AS last_replay_age_seconds,
    extract(epoch FROM pg_last_xact_replay_timestamp())::float8 AS last_replay_epoch,
    extract(epoch FROM clock_timestamp())::float8 AS clock_epoch,
    -- (on the primary only: a replica's own transactions are its readers', and summing them
    -- costs every replica's server a statistics snapshot each cycle)
    CASE WHEN NOT pg_is_in_recovery() THEN
        (SELECT sum(xact_commit + xact_rollback) FROM pg_stat_database)::float8 END AS xacts_total,
    -- The primary's transaction ID clock (64 bits: no wraparound): the xmax of this
    -- statement's snapshot, one past the latest ended transaction. Dates the horizon.
    CASE WHEN NOT pg_is_in_recovery() THEN pg_snapshot_xmax(pg_current_snapshot())::text::int8 END AS next_xid,
    -- The timeline a primary writes on: the first 8 hex digits of its current WAL file's
    -- name (pg_walfile_name() refuses to run in recovery; a replica's comes from its WAL
    -- receiver). Needs no privilege, unlike pg_control_checkpoint().
    CASE WHEN NOT pg_is_in_recovery() THEN
        ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int8 END AS timeline,
    -- Which server answered: two names for one server (a multi-host primary DSN that now
    -- lands on a promoted replica) must not count as two primaries.
    extract(epoch FROM pg_postmaster_start_time())::text || '/' || current_setting('port') AS server_id,
    -- Whether commits wait on standbys (read every cycle: a reload of the server changes them).
    current_setting('synchronous_standby_names') AS sync_standby_names,
    current_setting('synchronous_commit') AS synchronous_commit,
    -- What every commit record waits before a standby may replay it (remote_apply waits too).
    extract(epoch FROM current_setting('recovery_min_apply_delay')::interval)::float8 AS apply_delay_seconds"""

QUERIES = {
    # pg_is_wal_replay_paused() cannot tell "pause requested" from "paused" before 14.
    130000: f"""SELECT {_COMMON},
    CASE WHEN pg_is_in_recovery() THEN
        CASE WHEN pg_is_wal_replay_paused() THEN 'paused' ELSE 'not paused' END
    END AS replay_pause_state""",
    140000: f"""SELECT {_COMMON},
    CASE WHEN pg_is_in_recovery() THEN pg_get_wal_replay_pause_state() END AS replay_pause_state""",
}


@fast_init
@dataclass(frozen=True)
class ServerPosition:
    in_recovery: bool
    current_lsn: int | None  # primary only
    receive_lsn: int | None  # replica only (NULL on a primary)
    replay_lsn: int | None  # replica only
    replay_pause_state: str | None  # 'not paused' | 'pause requested' | 'paused'; None on a primary
    last_replay_age_seconds: float | None  # now() - pg_last_xact_replay_timestamp(): exported, never the headline
    # The last replayed commit's timestamp (the primary's clock, as written in the WAL) and
    # this server's clock at the answer, as Unix seconds. Only compared with the primary's
    # own clock_epoch: a commit bound on staleness that needs no two hosts' clocks to agree.
    last_replay_epoch: float | None = None
    clock_epoch: float | None = None
    # Transactions ended on this server since its stats were reset (pg_stat_database):
    # on the primary, how often it commits, so how long a stream waits between changes.
    xacts_total: float | None = None
    timeline: int | None = None  # a primary's current timeline (a replica's is its WAL receiver's)
    server_id: str | None = None  # postmaster start time and port: one value per running server
    sync_standby_names: str | None = None  # as the server has it (this session's view)
    synchronous_commit: str | None = None
    apply_delay_seconds: float | None = None  # recovery_min_apply_delay (a standby's)
    next_xid: int | None = None  # a primary's: one past its latest ended transaction ID, 64 bits

    @property
    def replay_paused(self) -> bool | None:
        if self.replay_pause_state is None:
            return None
        return self.replay_pause_state != "not paused"

    @property
    def received_lsn(self) -> int | None:
        """What a standby has of the WAL: what its cascaded replicas can get from it."""
        known = [lsn for lsn in (self.receive_lsn, self.replay_lsn) if lsn is not None]
        return max(known) if known else None

    @property
    def receive_replay_bytes(self) -> int | None:
        if self.receive_lsn is None or self.replay_lsn is None:
            return None
        return max(0, self.receive_lsn - self.replay_lsn)


def parse(rows: Sequence[Row]) -> ServerPosition:
    (row,) = rows
    return ServerPosition(
        in_recovery=bool(row["in_recovery"]),
        current_lsn=parse_lsn(row["current_lsn"]),
        receive_lsn=parse_lsn(row["receive_lsn"]),
        replay_lsn=parse_lsn(row["replay_lsn"]),
        replay_pause_state=row["replay_pause_state"],
        last_replay_age_seconds=opt_float(row["last_replay_age_seconds"]),
        last_replay_epoch=opt_float(row["last_replay_epoch"]),
        clock_epoch=opt_float(row["clock_epoch"]),
        xacts_total=opt_float(row["xacts_total"]),
        timeline=opt_int(row.get("timeline")),
        server_id=row.get("server_id"),
        sync_standby_names=row.get("sync_standby_names"),
        synchronous_commit=row.get("synchronous_commit"),
        apply_delay_seconds=opt_float(row.get("apply_delay_seconds")),
        next_xid=opt_int(row.get("next_xid")),
    )


VIEW = View("server", frozenset({"primary", "replica"}), QUERIES, parse)
