"""One module per PostgreSQL view: its SQL by server version and a pure parser.

The per-cycle views are listed in ``CYCLE_VIEWS``; ``probe`` runs once per connection and
``walinspect`` is a parameterised, opt-in extra.
"""

from typing import Any

from lagwatch.views import (
    horizon,
    recovery,
    replication,
    server,
    slots,
    slotsync,
    subscriptions,
    wal,
    wal_dir,
    wal_receiver,
)
from lagwatch.views.base import View

CYCLE_VIEWS: tuple[View[Any], ...] = (
    server.VIEW,
    replication.VIEW,
    wal_receiver.VIEW,
    recovery.VIEW,
    slotsync.VIEW,
    slots.VIEW,
    horizon.VIEW,
    subscriptions.VIEW,
    wal.VIEW,
    wal_dir.VIEW,
)

__all__ = ["CYCLE_VIEWS", "View"]
