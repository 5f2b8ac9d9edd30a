"""The rooms: each thing lagwatch reads from PostgreSQL with everything about it (rooms/
base.py), and the one place they are registered: a room is added by its module, its test,
and its entry here. The reader reads their views, the tracker keeps one keeper of each per
cluster, and the exposition, /api/status, /status, the probe and ``check --grants`` iterate
over them.
"""

from __future__ import annotations

from typing import Any

from lagwatch.rooms import archiver, horizon, slots, slotsync, subscriptions, wal, wal_dir
from lagwatch.rooms.base import Grant, Room
from lagwatch.views.base import View
from lagwatch.views.probe import Capabilities

ROOMS: tuple[Room[Any, Any], ...] = (
    slots.ROOM,
    wal.ROOM,
    wal_dir.ROOM,
    archiver.ROOM,
    horizon.ROOM,
    subscriptions.ROOM,
    slotsync.ROOM,
)

VIEWS: tuple[View[Any], ...] = tuple(room.view for room in ROOMS)


def probe_columns() -> dict[str, str]:
    """What the rooms ask once per connection (column -> SQL), their grants' checks among them."""
    out: dict[str, str] = {}
    for room in ROOMS:
        out.update(room.probe)
        out.update({grant.name: grant.held for grant in room.grants})
    return out


def grants() -> tuple[tuple[Room[Any, Any], Grant], ...]:
    return tuple((room, grant) for room in ROOMS for grant in room.grants)


def missing_grants(caps: Capabilities) -> tuple[tuple[Room[Any, Any], Grant], ...]:
    """The rooms' grants a connection lacks, where the room's view applies to its server and
    role (said once at connect by the reader, and by ``check --grants``)."""
    role = "replica" if caps.in_recovery else "primary"
    return tuple((room, grant) for room, grant in grants()
                 if caps.asked.get(grant.name) is False and role in room.view.roles and room.view.applies(caps))


__all__ = ["ROOMS", "VIEWS", "Grant", "Room", "grants", "missing_grants", "probe_columns"]
