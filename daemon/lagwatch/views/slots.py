"""pg_replication_slots on the primary: what each slot holds back, and whether it is safe."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lagwatch.fastinit import fast_init
from lagwatch.lsn import parse_lsn
from lagwatch.views.base import Row, View, opt_float, opt_int

_BASE = """SELECT slot_name, slot_type, database, plugin, active, temporary,
    wal_status, safe_wal_size,
    pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::float8 AS retained_bytes,
    pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::float8 AS confirmed_flush_lag_bytes,
    confirmed_flush_lsn::text AS confirmed_flush_lsn,
    -- The vacuum horizon it holds: a physical slot's xmin (a replica's hot_standby_feedback),
    -- a logical slot's catalog_xmin (the catalog rows its decoding needs), in transactions.
    age(xmin)::int8 AS xmin_age, age(catalog_xmin)::int8 AS catalog_xmin_age,
    -- The held transaction IDs themselves (32 bits), to date them (vacuumhorizon.py).
    (CASE WHEN age(xmin) >= coalesce(age(catalog_xmin), -1) THEN xmin ELSE catalog_xmin END)::text::int8
        AS held_xid,
    {extra}
FROM pg_replication_slots
ORDER BY slot_name"""

_NONE_17 = "NULL::boolean AS failover, NULL::boolean AS synced"
_NONE_18 = "NULL::float8 AS idle_timeout_left"
# 18 invalidates a slot idle for idle_replication_slot_timeout (at a checkpoint): the time
# left is counted from inactive_since, on the server's own clock.
_IDLE_LEFT = """CASE WHEN current_setting('idle_replication_slot_timeout')::interval > interval '0'
        AND inactive_since IS NOT NULL AND restart_lsn IS NOT NULL AND NOT synced
        THEN extract(epoch FROM inactive_since + current_setting('idle_replication_slot_timeout')::interval
                                - clock_timestamp())::float8 END AS idle_timeout_left"""

QUERIES = {
    # wal_status and safe_wal_size arrived in 13.
    130000: _BASE.format(extra="NULL::boolean AS conflicting, NULL::float8 AS inactive_seconds, "
                               "NULL::text AS invalidation_reason, NULL::boolean AS two_phase, "
                               f"{_NONE_17}, {_NONE_18}"),
    140000: _BASE.format(extra="NULL::boolean AS conflicting, NULL::float8 AS inactive_seconds, "
                               f"NULL::text AS invalidation_reason, two_phase, {_NONE_17}, {_NONE_18}"),
    160000: _BASE.format(extra="conflicting, NULL::float8 AS inactive_seconds, NULL::text AS invalidation_reason, "
                               f"two_phase, {_NONE_17}, {_NONE_18}"),
    # 17 records when a slot went inactive and why it was invalidated; failover slots.
    170000: _BASE.format(extra="conflicting, "
                               "extract(epoch FROM clock_timestamp() - inactive_since)::float8 AS inactive_seconds, "
                               f"invalidation_reason, two_phase, failover, synced, {_NONE_18}"),
    180000: _BASE.format(extra="conflicting, "
                               "extract(epoch FROM clock_timestamp() - inactive_since)::float8 AS inactive_seconds, "
                               f"invalidation_reason, two_phase, failover, synced, {_IDLE_LEFT}"),
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
    xmin_age: int | None = None  # transactions since the xmin it holds (a physical slot's feedback)
    catalog_xmin_age: int | None = None  # since the catalog_xmin it holds (a logical slot)
    two_phase: bool | None = None  # 14+: decodes prepared transactions at PREPARE
    failover: bool | None = None  # 17+: synced to standbys that may be promoted
    synced: bool | None = None  # 17+: on a standby, synced from the primary
    idle_timeout_left: float | None = None  # 18+: seconds until idle_replication_slot_timeout may invalidate it
    confirmed_flush_lsn: int | None = None  # a logical slot's: what its consumer last confirmed
    held_xid: int | None = None  # the 32-bit ID of the xmin or catalog_xmin it holds (the older)

    @property
    def horizon_age(self) -> int | None:
        """The older of the two horizons it holds, in transactions (None: it holds none)."""
        ages = [a for a in (self.xmin_age, self.catalog_xmin_age) if a is not None]
        return max(ages) if ages else None


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
            xmin_age=opt_int(row.get("xmin_age")),
            catalog_xmin_age=opt_int(row.get("catalog_xmin_age")),
            two_phase=row.get("two_phase"),
            failover=row.get("failover"),
            synced=row.get("synced"),
            idle_timeout_left=opt_float(row.get("idle_timeout_left")),
            confirmed_flush_lsn=parse_lsn(row.get("confirmed_flush_lsn")),
            held_xid=opt_int(row.get("held_xid")),
        )
        for row in rows
    )


VIEW = View("slots", frozenset({"primary"}), QUERIES, parse)
