"""pg_replication_slots on the primary: what each slot holds back, and whether it is safe."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lagwatch.fastinit import fast_init
from lagwatch.views.base import Row, View, opt_float, opt_int

_BASE = """SELECT slot_name, slot_type, database, plugin, active, temporary,
    wal_status, safe_wal_size,
    pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::float8 AS retained_bytes,
    pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::float8 AS confirmed_flush_lag_bytes,
    {extra}
FROM pg_replication_slots
ORDER BY slot_name"""

QUERIES = {
    # wal_status and safe_wal_size arrived in 13.
    130000: _BASE.format(extra="NULL::boolean AS conflicting, NULL::float8 AS inactive_seconds, "
                               "NULL::text AS invalidation_reason"),
    160000: _BASE.format(extra="conflicting, NULL::float8 AS inactive_seconds, NULL::text AS invalidation_reason"),
    # 17 records when a slot went inactive and why it was invalidated.
    170000: _BASE.format(extra="conflicting, "
                               "extract(epoch FROM clock_timestamp() - inactive_since)::float8 AS inactive_seconds, "
                               "invalidation_reason"),
}


@fast_init
@dataclass(frozen=True)
class Slot:
    name: str
    slot_type: str  # physical | logical
    database: str | None
    plugin: str | None
    active: bool
    temporary: bool
    wal_status: str | None  # reserved | extended | unreserved | lost
    safe_wal_size: int | None  # bytes left before max_slot_wal_keep_size; None when unlimited
    retained_bytes: int | None  # pg_current_wal_lsn() - restart_lsn
    confirmed_flush_lag_bytes: int | None  # logical slots only
    conflicting: bool | None  # 16+
    inactive_seconds: float | None  # 17+, now - inactive_since
    invalidation_reason: str | None  # 17+


def parse(rows: Sequence[Row]) -> tuple[Slot, ...]:
    return tuple(
        Slot(
            name=row["slot_name"],
            slot_type=row["slot_type"],
            database=row["database"],
            plugin=row["plugin"],
            active=bool(row["active"]),
            temporary=bool(row["temporary"]),
            wal_status=row["wal_status"],
            safe_wal_size=opt_int(row["safe_wal_size"]),
            retained_bytes=opt_int(row["retained_bytes"]),
            confirmed_flush_lag_bytes=opt_int(row["confirmed_flush_lag_bytes"]),
            conflicting=row["conflicting"],
            inactive_seconds=opt_float(row["inactive_seconds"]),
            invalidation_reason=row["invalidation_reason"],
        )
        for row in rows
    )


VIEW = View("slots", frozenset({"primary"}), QUERIES, parse)
