"""A standby's copies of the primary's failover slots (PostgreSQL 17+): whether it syncs
them (``sync_replication_slots`` and its slot sync worker) and which it holds, synced and
usable. A logical consumer whose slot has no usable copy on the standby that gets promoted
loses its place: its subscription or CDC pipeline breaks at the failover.

Before 17 the view does not apply (nothing is read). From 17 it is read on one poll in
``SLOW_EVERY`` (views/base.py: the slots it holds change as the primary's do, seldom), and
only ``sync_replication_slots`` is looked at unless it is on: the slot sync worker (in
``pg_stat_activity``, which builds a row for every session) and the synced copies (in
``pg_replication_slots``) are read on a standby that syncs, so one that does not pays one
``current_setting()`` every tenth poll.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lagwatch.fastinit import fast_init
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
