"""Who holds the primary's vacuum horizon back, in transactions: its slots (read every
poll), and the walsenders' hot_standby_feedback, its own sessions and prepared transactions
(views/horizon.py: read on one poll in ten, kept in between). Pure."""

from __future__ import annotations

from collections.abc import Sequence

from lagwatch.views.horizon import Horizon
from lagwatch.views.slots import Slot


class HorizonHolders:
    def __init__(self) -> None:
        self._last: Horizon | None = None

    def note(self, answered: bool, horizon: Horizon | None, slots: Sequence[Slot]) -> dict[str, int]:
        """The holders as of this poll: "slot/NAME", "replica/APPLICATION_NAME",
        "sessions", "prepared". ``answered``: the primary answered this cycle."""
        if not answered:
            self._last = None  # no primary, or another: what was read is not its
        elif horizon is not None:
            self._last = horizon
        held = {f"slot/{s.name}": age for s in slots if (age := s.horizon_age) is not None}
        h = self._last
        if h is not None:
            held.update({f"replica/{name}": xids for name, xids in h.walsenders.items()})
            held.update({name: xids for name, xids in (("sessions", h.sessions), ("prepared", h.prepared))
                         if xids is not None})
        return held
