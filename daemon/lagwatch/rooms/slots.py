"""pg_replication_slots on the primary: what each slot holds back, and whether it is safe.

Read on the primary every poll. The slots are also an input of the estimate stage (the
logical consumers, the runway forecasts, and the rooms that judge against them: pg_wal's
share, the vacuum horizon, the failover slots' copies, through rooms/base.py's Cycle); this
room says them: their families, their part of /api/status (with each one's runway, the
tracker's forecast, handed over in the cycle) and the /status line of those whose
safe_wal_size shrinks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from lagwatch.fastinit import fast_init
from lagwatch.lsn import parse_lsn
from lagwatch.render import families as f
from lagwatch.render.html import dur, esc
from lagwatch.rooms.base import Cycle, KeepsNothing, Room
from lagwatch.views.base import Row, View, opt_float, opt_int

_BASE = """SELECT slot_name, slot_type, database, plugin, active, temporary,
    wal_status, safe_wal_size,
    pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::float8 AS retained_bytes,
    pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::float8 AS confirmed_flush_lag_bytes,
    confirmed_flush_lsn::text AS confirmed_flush_lsn,
    -- The vacuum horizon it holds: a physical slot's xmin (a replica's hot_standby_feedback),
    -- a logical slot's catalog_xmin (the catalog rows its decoding needs), in transactions.
    age(xmin)::int8 AS xmin_age, age(catalog_xmin)::int8 AS catalog_xmin_age,
    -- The held transaction IDs themselves (32 bits), to date them (estimate/xidclock.py).
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


@dataclass(frozen=True)
class Slots:
    slots: tuple[Slot, ...]  # the leading primary's (none when it did not answer)
    # Limited slots (max_slot_wal_keep_size): seconds until safe_wal_size is 0 at the net
    # rate over forecast_horizon (estimate/rates.py), +Inf when it does not shrink.
    runways: Mapping[str, float]


class SlotsKeeper(KeepsNothing):
    """The leading primary's slots as read this poll (the cycle's: the tracker read them
    from this room's readings), with the tracker's runways."""

    def update(self, readings: Mapping[str, tuple[Slot, ...]], cycle: Cycle) -> Slots:
        return Slots(cycle.slots, cycle.slot_runways)


# -- what it exports ------------------------------------------------------------------------
_SECTION = "slots"
C, S = "cluster", "slot"
WAL_STATUSES = ("reserved", "extended", "unreserved", "lost")
IDLE_LEFT = f.gauge("lagwatch_slot_idle_timeout_left_seconds", "Seconds until idle_replication_slot_timeout may "
                    "invalidate the inactive slot, at the next checkpoint (PostgreSQL 18+; absent when off)", C, S,
                    section=_SECTION)
RETAINED = f.gauge("lagwatch_slot_retained_bytes", "WAL the slot holds back: pg_current_wal_lsn() - restart_lsn", C, S,
                   section=_SECTION)
ACTIVE = f.gauge("lagwatch_slot_active", "1 if a consumer is connected to the slot", C, S, section=_SECTION)
SAFE = f.gauge("lagwatch_slot_safe_wal_size_bytes", "WAL that can still be written before the slot is in danger of "
               "losing its WAL (absent when max_slot_wal_keep_size is unlimited)", C, S, section=_SECTION)
STATUS = f.gauge("lagwatch_slot_wal_status", "1 for the slot's current wal_status", C, S, "status", section=_SECTION)
INACTIVE = f.gauge("lagwatch_slot_inactive_seconds", "Time since the slot became inactive (PostgreSQL 17+)", C, S,
                   section=_SECTION)
LOGICAL_LAG = f.gauge("lagwatch_slot_confirmed_flush_lag_bytes", "Logical slot: current LSN minus "
                      "confirmed_flush_lsn", C, S, section=_SECTION)
INFO = f.info("lagwatch_slot", "Slot type and state", C, S, "slot_type", "database", "plugin", "temporary",
              "conflicting", "invalidation_reason", section=_SECTION)
RUNWAY = f.gauge("lagwatch_slot_runway_seconds", "Seconds until safe_wal_size reaches 0 at the current net rate "
                 "(WAL written minus WAL the consumer releases, over forecast_horizon); +Inf when it does not "
                 "shrink; absent when max_slot_wal_keep_size is unlimited", C, S, section=_SECTION)
FAMILIES = (IDLE_LEFT, RETAINED, ACTIVE, SAFE, STATUS, INACTIVE, LOGICAL_LAG, INFO, RUNWAY)


def export(cluster: str, value: Slots) -> None:
    for s in value.slots:
        key = [cluster, s.name]
        for spec, number in ((ACTIVE, float(s.active)), (RETAINED, s.retained_bytes), (SAFE, s.safe_wal_size),
                             (INACTIVE, s.inactive_seconds), (LOGICAL_LAG, s.confirmed_flush_lag_bytes),
                             (IDLE_LEFT, s.idle_timeout_left)):
            if number is not None:
                spec.add(key, number)
        if s.wal_status is not None:
            STATUS.make().add_metrics(key, ((status, float(s.wal_status == status)) for status in WAL_STATUSES))
        INFO.make().add_metric(key + [s.slot_type, s.database or "", s.plugin or "", str(s.temporary).lower(),
                                      "" if s.conflicting is None else str(s.conflicting).lower(),
                                      s.invalidation_reason or ""])
    for name, seconds in sorted(value.runways.items()):
        RUNWAY.add([cluster, name], seconds)


# -- what it shows ----------------------------------------------------------------------------
def _runway(seconds: float | None) -> dict[str, Any]:
    # JSON has no infinity: a slot whose safe_wal_size does not shrink has runway_seconds null.
    return {"runway_seconds": None if seconds is None or math.isinf(seconds) else seconds,
            "shrinking": None if seconds is None else not math.isinf(seconds)}


def status(value: Slots | None) -> list[dict[str, Any]]:
    """/api/status's "slots": the leading primary's, each with its runway."""
    if value is None:
        return []
    return [{**asdict(s), **_runway(value.runways.get(s.name))} for s in value.slots]


def page(value: Slots | None) -> str:
    """Slots whose safe_wal_size shrinks: how long until they lose their WAL."""
    shrinking = sorted((seconds, name) for name, seconds in (value.runways if value else {}).items()
                       if not math.isinf(seconds))
    if not shrinking:
        return ""
    items = ", ".join(f'<span class="{"bad" if s < 3600 else "warn"}">{esc(n)}: {esc(dur(s))}</span>'
                      for s, n in shrinking)
    return f'<div class="meta slots">slot runway (until safe_wal_size is 0): {items}</div>'


ROOM = Room(VIEW, FAMILIES, SlotsKeeper, export, status, page)
