"""Who holds the primary's vacuum horizon back, in transactions: its slots (read every
poll), and the walsenders' hot_standby_feedback, its own sessions and prepared transactions
(views/horizon.py: read on one poll in ten, carried in between by the poll); and, for the slots, for how
long. Pure.

How long: the primary's transaction ID clock (views/server.py's ``next_xid``, one past its
latest ended transaction, 64 bits) is recorded each poll beside lagwatch's monotonic time,
in an LsnClock (estimate/lsnclock.py: the same bracketing, over transaction IDs instead of WAL bytes). A
slot's held ID (32 bits, made 64 against the clock) was handed out no later than the first
poll that saw the clock past it: the time since then is how long the slot has held the
horizon at least (a lower bound, by up to one interval; "since lagwatch started" for IDs
older than its history). The walsenders' feedback without a slot comes as ages only, and
is not dated.
"""

from __future__ import annotations

from collections.abc import Sequence

from lagwatch.estimate.lsnclock import LsnClock
from lagwatch.views.horizon import Horizon
from lagwatch.views.slots import Slot

_XID_SPACE = 1 << 32
# Points the transaction ID clock keeps (thinned as the LSN clock is): hours of history.
XID_CLOCK_POINTS = 512


class HorizonHolders:
    def __init__(self) -> None:
        self._xids = LsnClock(XID_CLOCK_POINTS)

    @staticmethod
    def note(horizon: Horizon | None, slots: Sequence[Slot]) -> dict[str, int]:
        """The holders as of this poll: "slot/NAME", "replica/APPLICATION_NAME",
        "sessions", "prepared" (``horizon``: the primary's answer's, None without one)."""
        held = {f"slot/{s.name}": age for s in slots if (age := s.horizon_age) is not None}
        h = horizon
        if h is not None:
            held.update({f"replica/{name}": xids for name, xids in h.walsenders.items()})
            held.update({name: xids for name, xids in (("sessions", h.sessions), ("prepared", h.prepared))
                         if xids is not None})
        return held

    def dated(self, next_xid: int | None, at: float, slots: Sequence[Slot]) -> dict[str, float]:
        """How long each slot has held the horizon, at least, in seconds ("slot/NAME");
        ``next_xid``: the primary's clock this poll (None: no answer; nothing is dated)."""
        if next_xid is None:
            return {}
        if self._xids.latest_lsn is not None and next_xid < self._xids.latest_lsn:
            self._xids = LsnClock(XID_CLOCK_POINTS)  # another server (a failover): its own IDs
        self._xids.record(next_xid, at)
        out = {}
        for s in slots:
            if s.held_xid is None:
                continue
            held = self._xids.age(widen(s.held_xid, next_xid), at)
            if held is not None:
                out[f"slot/{s.name}"] = held
        return out


def widen(xid: int, next_xid: int) -> int:
    """A 32-bit transaction ID as the 64-bit one it is: the latest at or before ``next_xid``
    with those low bits (a held ID is never ahead of the clock by more than the transactions
    still running; one that is counts as just handed out)."""
    behind = (next_xid - xid) % _XID_SPACE
    if behind >= _XID_SPACE // 2:  # ahead of the clock: a transaction still running
        return next_xid
    return next_xid - behind
