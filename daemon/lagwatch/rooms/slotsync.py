"""A standby's copies of the primary's failover slots (PostgreSQL 17+): whether it syncs
them (``sync_replication_slots`` and its slot sync worker) and which it holds, synced and
usable. A logical consumer whose slot has no usable copy on the standby that gets promoted
loses its place: its subscription or CDC pipeline breaks at the failover.

Before 17 the view does not apply (nothing is read). From 17 it is read on one poll in
``SLOW_EVERY`` (views/base.py: the slots it holds change as the primary's do, seldom), and
only ``sync_replication_slots`` is looked at unless it is on: the slot sync worker (in
``pg_stat_activity``, which builds a row for every session) and the synced copies (in
``pg_replication_slots``) are read on a standby that syncs, so one that does not pays one
``current_setting()`` every tenth poll. Each standby's copies are judged against the
primary's failover slots this cycle (the cycle's slots: rooms/base.py's Cycle).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lagwatch.fastinit import fast_init
from lagwatch.render import families as f
from lagwatch.render.html import esc
from lagwatch.rooms.base import Cycle, KeepsNothing, Room
from lagwatch.views.base import SLOW_EVERY, Row, View
from lagwatch.views.probe import Capabilities

QUERIES = {
    # A synced copy is usable once it is persistent (a new one stays temporary until the
    # standby has caught up with the primary's slot) and not invalidated.
    170000: """SELECT s.enabled,
    CASE WHEN s.enabled THEN EXISTS (SELECT 1 FROM pg_stat_activity WHERE backend_type = 'slotsync worker') END
        AS worker,
    CASE WHEN s.enabled THEN (SELECT coalesce(json_agg(slot_name ORDER BY slot_name), '[]'::json)
                              FROM pg_replication_slots WHERE synced AND NOT temporary AND invalidation_reason IS NULL)
    END AS synced
FROM (SELECT current_setting('sync_replication_slots')::boolean AS enabled) s""",
}


@fast_init
@dataclass(frozen=True)
class SlotSync:
    enabled: bool  # sync_replication_slots
    worker: bool  # its slot sync worker runs (False while not enabled)
    synced: frozenset[str]  # the failover slots it holds synced, persistent and valid

    @property
    def syncing(self) -> bool:
        return self.enabled and self.worker


def parse(rows: Sequence[Row]) -> SlotSync | None:
    if not rows or rows[0].get("enabled") is None:
        return None
    row = rows[0]
    return SlotSync(bool(row["enabled"]), bool(row.get("worker")), frozenset(str(s) for s in row.get("synced") or ()))


def applies(caps: Capabilities) -> bool:
    return caps.major >= 17


VIEW = View("slotsync", frozenset({"replica"}), QUERIES, parse, applies=applies, every=SLOW_EVERY)


@dataclass(frozen=True)
class FailoverCopies:
    # The standbys that answered with it (17+), in node order: every node in recovery but the
    # one that leads (a standby cluster's leader), a former primary now following included:
    # any of them may be promoted, and a promotion without a copy loses a consumer its place.
    by_standby: Mapping[str, SlotSync]
    failover: tuple[str, ...]  # the primary's failover slots this cycle

    def missing(self, standby: str) -> list[str]:
        """The failover slots ``standby`` holds no usable, kept-in-sync copy of."""
        sync = self.by_standby[standby]
        return [slot for slot in self.failover if not (sync.syncing and slot in sync.synced)]


class SlotSyncKeeper(KeepsNothing):
    """The poll carries the view between its reads; the primary's slots come with each cycle."""

    def update(self, readings: Mapping[str, SlotSync | None], cycle: Cycle) -> FailoverCopies | None:
        by_standby = {node: sync for node, sync in sorted(readings.items())
                      if sync is not None and node != cycle.primary}
        if not by_standby:
            return None
        return FailoverCopies(by_standby, tuple(s.name for s in cycle.slots if s.failover))


# -- what it exports ------------------------------------------------------------------------
_SECTION = "Failover slots' copies on the standbys"
C, R = "cluster", "replica"
RUNNING = f.gauge("lagwatch_replica_slot_sync_running", "1 if the standby syncs the primary's failover slots "
                  "(sync_replication_slots on and its slot sync worker running; PostgreSQL 17+)", C, R,
                  section=_SECTION)
SYNCED = f.gauge("lagwatch_slot_synced", "For each failover slot on the primary and each standby (17+): 1 if the "
                 "standby holds a synced, persistent, valid copy and keeps syncing it; 0 if a promotion of that "
                 "standby would lose the slot's consumer its place", C, R, "slot", section=_SECTION)
FAMILIES = (RUNNING, SYNCED)


def export(cluster: str, copies: FailoverCopies) -> None:
    for standby, sync in copies.by_standby.items():
        RUNNING.add([cluster, standby], float(sync.syncing))
        for slot in copies.failover:
            SYNCED.add([cluster, standby, slot], float(sync.syncing and slot in sync.synced))


# -- what it shows ----------------------------------------------------------------------------
def status(copies: FailoverCopies | None) -> list[dict[str, Any]] | None:
    """/api/status's "slotsync": per standby that answered (17+), whether it syncs and the
    copies it holds (null: none answered with it)."""
    if copies is None:
        return None
    return [{"node": node, "enabled": s.enabled, "worker": s.worker, "synced": sorted(s.synced),
             "missing": copies.missing(node)} for node, s in copies.by_standby.items()]


def page(copies: FailoverCopies | None) -> str:
    """Said where the primary has failover slots: which standbys could be promoted without
    losing a logical consumer its place."""
    if copies is None or not copies.failover:
        return ""
    items = []
    for node, s in copies.by_standby.items():
        missing = copies.missing(node)
        if not s.syncing:
            items.append(f'<span class="bad">{esc(node)}: not syncing</span>')
        elif missing:
            items.append(f'<span class="bad">{esc(node)}: no copy of {esc(", ".join(missing))}</span>')
        else:
            items.append(f"{esc(node)}: all synced")
    return f'<div class="meta slotsync">failover slots on the standbys: {"; ".join(items)}</div>'


ROOM = Room(VIEW, FAMILIES, SlotSyncKeeper, export, status, page)
