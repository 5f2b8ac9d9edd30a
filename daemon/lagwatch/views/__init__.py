"""One module per PostgreSQL view: its SQL by server version, a pure parser, and when it is
read (views/base.py: roles, the servers it applies to, its cadence).

The views a poll reads are listed in ``CYCLE_VIEWS``; ``probe`` runs once per connection and
``walinspect`` is a parameterised, opt-in extra.
"""

from typing import Any

from lagwatch.views import (
    recovery,
    replication,
    server,
    startup_io,
    wal_receiver,
)
from lagwatch.views.base import View

CYCLE_VIEWS: tuple[View[Any], ...] = (
    server.VIEW,
    replication.VIEW,
    wal_receiver.VIEW,
    recovery.VIEW,
    startup_io.VIEW,
)

__all__ = ["CYCLE_VIEWS", "View"]
