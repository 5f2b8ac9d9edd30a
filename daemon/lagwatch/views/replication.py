"""pg_stat_replication on the primary: one row per walsender of a physical replica."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lagwatch.fastinit import fast_init
from lagwatch.lsn import parse_lsn
from lagwatch.views.base import Row, View, opt_float

QUERIES = {
    130000: """SELECT r.application_name, r.client_addr::text AS client_addr, r.state, r.sync_state,
    r.sent_lsn::text AS sent_lsn, r.write_lsn::text AS write_lsn,
    r.flush_lsn::text AS flush_lsn, r.replay_lsn::text AS replay_lsn,
    pg_current_wal_lsn()::text AS current_lsn,
    extract(epoch FROM r.write_lag)::float8 AS write_lag,
    extract(epoch FROM r.flush_lag)::float8 AS flush_lag,
    extract(epoch FROM r.replay_lag)::float8 AS replay_lag,
    s.slot_name
FROM pg_stat_replication r
LEFT JOIN pg_replication_slots s ON s.active_pid = r.pid
-- A base backup's walsenders and logical subscribers are not read replicas. (state is
-- NULL to a role without pg_read_all_stats: such rows stay, with what it may see.)
WHERE r.state IS DISTINCT FROM 'backup' AND r.application_name IS DISTINCT FROM 'pg_basebackup'
  AND coalesce(s.slot_type, 'physical') = 'physical'
ORDER BY r.application_name, r.pid""",
}

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


def parse(rows: Sequence[Row]) -> tuple[WalSender, ...]:
    senders: dict[str, WalSender] = {}
    for row in rows:
        if row["application_name"] is None and row["state"] is None:
            continue  # without pg_read_all_stats a walsender shows its pid only: nothing to tell
        name = row["application_name"] or ""
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


VIEW = View("replication", frozenset({"primary"}), QUERIES, parse)
