"""The vacuum horizon on the primary: who holds back the oldest row versions VACUUM may
remove, in transactions (``age()``), and for how long.

A slot's xmin and catalog_xmin come with the slots, every poll (rooms/slots.py, through the
cycle: rooms/base.py's Cycle); this room's view reads the others: a replica's
``hot_standby_feedback`` through a walsender without a slot (its ``backend_xmin``), the
primary's own sessions, and prepared transactions. ``pg_stat_activity`` builds a row for
every session, so the view is read on one poll in ``SLOW_EVERY`` on each connection (the
first, then every tenth: views/base.py); on the others it is not in the statement at all
and the poll carries what was read last.

How long: a slot's held ID is dated on the primary's transaction ID clock (estimate/
xidclock.py, the cycle's ``xid_age``): a lower bound, within one interval. The walsenders'
feedback without a slot comes as ages only, and is not dated. Above the cluster's
``horizon_alert_xids`` LagwatchReplicationHoldsHorizon fires (its threshold is exported).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lagwatch.fastinit import fast_init
from lagwatch.render import families as f
from lagwatch.render.html import dur, esc
from lagwatch.rooms.base import Cycle, KeepsNothing, Room
from lagwatch.rooms.slots import Slot
from lagwatch.views.base import SLOW_EVERY, Row, View, opt_int

QUERIES = {
    130000: """SELECT json_build_object(
        'walsenders', coalesce(json_object_agg(application_name, xids) FILTER (WHERE backend_type = 'walsender'),
                               '{}'::json),
        'sessions', max(xids) FILTER (WHERE backend_type <> 'walsender'),
        'prepared', (SELECT max(age(transaction))::int8 FROM pg_prepared_xacts)) AS held
    FROM (SELECT backend_type, application_name, greatest(age(backend_xmin), age(backend_xid))::int8 AS xids
          FROM pg_stat_activity
          WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) AND pid <> pg_backend_pid()) a""",
}


@fast_init
@dataclass(frozen=True)
class Horizon:
    """What holds the primary's vacuum horizon besides its slots, in transactions."""

    walsenders: Mapping[str, int] = field(default_factory=dict)  # by application_name: hot_standby_feedback
    sessions: int | None = None  # the oldest of the primary's own sessions (snapshot or transaction)
    prepared: int | None = None  # the oldest prepared transaction


def parse(rows: Sequence[Row]) -> Horizon:
    held = (rows[0].get("held") if rows else None) or {}
    return Horizon({str(k): int(v) for k, v in (held.get("walsenders") or {}).items() if v is not None},
                   opt_int(held.get("sessions")), opt_int(held.get("prepared")))


VIEW = View("horizon", frozenset({"primary"}), QUERIES, parse, every=SLOW_EVERY)


@dataclass(frozen=True)
class VacuumHorizon:
    """Who holds the primary's vacuum horizon back this cycle."""

    # In transactions, by holder: "slot/NAME", "replica/APPLICATION_NAME", "sessions", "prepared".
    held_xids: Mapping[str, int]
    held_seconds: Mapping[str, float]  # slots ("slot/NAME"): how long, at least
    alert_xids: int  # the cluster's horizon_alert_xids


def holders(read: Horizon | None, slots: Sequence[Slot]) -> dict[str, int]:
    """The holders as of this poll (``read``: the primary's answer's, None without one)."""
    held = {f"slot/{s.name}": age for s in slots if (age := s.horizon_age) is not None}
    if read is not None:
        held.update({f"replica/{name}": xids for name, xids in read.walsenders.items()})
        held.update({name: xids for name, xids in (("sessions", read.sessions), ("prepared", read.prepared))
                     if xids is not None})
    return held


def held_for(slots: Sequence[Slot], cycle: Cycle) -> dict[str, float]:
    """How long each slot has held the horizon, at least, in seconds ("slot/NAME")."""
    out = {}
    for s in slots:
        if s.held_xid is not None and (seconds := cycle.xid_age(s.held_xid)) is not None:
            out[f"slot/{s.name}"] = seconds
    return out


class HorizonKeeper(KeepsNothing):
    """The poll carries the view between its reads, the slots come each cycle, and the
    transaction ID clock is the tracker's."""

    def update(self, readings: Mapping[str, Horizon], cycle: Cycle) -> VacuumHorizon:
        # The leading primary's answer: its slots are the cycle's (none when it did not answer).
        return VacuumHorizon(holders(cycle.leading(readings), cycle.slots), held_for(cycle.slots, cycle),
                             cycle.options.horizon_alert_xids)


# -- what it exports ------------------------------------------------------------------------
_SECTION = "Vacuum horizon"
C = "cluster"
HELD = f.gauge("lagwatch_horizon_held_xids", "Transactions the primary's vacuum horizon is held back by each "
               "holder: slot/NAME (its xmin or catalog_xmin), replica/APPLICATION_NAME (hot_standby_feedback "
               "through a walsender without a slot), sessions (the primary's oldest), prepared (the oldest "
               "prepared transaction); read on one poll in ten but the slots", C, "holder", section=_SECTION)
SECONDS = f.gauge("lagwatch_horizon_held_seconds", "How long a slot (holder slot/NAME) has held the primary's vacuum "
                  "horizon, at least: since the primary's transaction ID clock passed the ID it holds (dated within "
                  "one interval; from lagwatch's start for older ones)", C, "holder", section=_SECTION)
ALERT = f.gauge("lagwatch_horizon_alert_xids", "The cluster's horizon_alert_xids from the config: above it, "
                "replication holding the horizon alerts", C, section=_SECTION)
FAMILIES = (HELD, SECONDS, ALERT)


def export(cluster: str, h: VacuumHorizon) -> None:
    for holder, xids in sorted(h.held_xids.items()):
        HELD.add([cluster, holder], xids)
    for holder, seconds in sorted(h.held_seconds.items()):
        SECONDS.add([cluster, holder], seconds)
    ALERT.add([cluster], h.alert_xids)


# -- what it shows ----------------------------------------------------------------------------
def status(h: VacuumHorizon | None) -> dict[str, Any] | None:
    """/api/status's "horizon": the holders in transactions, the slots' hold in seconds, the
    threshold the alert uses."""
    if h is None:
        return None
    return {"held_xids": dict(h.held_xids), "held_seconds": dict(h.held_seconds), "alert_xids": h.alert_xids}


def page(h: VacuumHorizon | None) -> str:
    """The holders, oldest first, replication's past the alert's threshold said so."""
    if h is None or not h.held_xids:
        return ""
    items = []
    for holder, xids in sorted(h.held_xids.items(), key=lambda kv: (-kv[1], kv[0])):
        seconds = h.held_seconds.get(holder)
        item = f"{esc(holder)} {xids:,} xids" + ("" if seconds is None else f" for {esc(dur(seconds))}+")
        # Marked as the alert marks it: replication's holders only (a session's or a prepared
        # transaction's hold is shown, but LagwatchReplicationHoldsHorizon is about replication).
        alerting = xids > h.alert_xids and holder.startswith(("slot/", "replica/"))
        items.append(f'<span class="warn">{item} (over horizon_alert_xids)</span>' if alerting else item)
    return f'<div class="meta horizon">vacuum horizon held by: {"; ".join(items)}</div>'


ROOM = Room(VIEW, FAMILIES, HorizonKeeper, export, status, page)
