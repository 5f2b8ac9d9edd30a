"""The primary's transaction ID clock: when it passed a transaction ID. Pure.

The primary's next transaction ID (views/server.py's ``next_xid``, one past its latest
ended transaction, 64 bits) is recorded each poll beside lagwatch's monotonic time, in an
LsnClock (estimate/lsnclock.py: the same bracketing, over transaction IDs instead of WAL
bytes). An ID a slot holds (32 bits, made 64 against the clock) was handed out no later
than the first poll that saw the clock past it: the time since then is how long it has
been held at least (a lower bound, by up to one interval; "since lagwatch started" for IDs
older than its history). The vacuum horizon's room dates its slots with it (rooms/
horizon.py, through rooms/base.py's Cycle).
"""

from __future__ import annotations

from lagwatch.estimate.lsnclock import LsnClock

_XID_SPACE = 1 << 32
# Points the clock keeps (thinned as the LSN clock is): hours of history.
XID_CLOCK_POINTS = 512


class XidClock:
    def __init__(self) -> None:
        self._xids = LsnClock(XID_CLOCK_POINTS)
        self._next: int | None = None
        self._at = 0.0

    def record(self, next_xid: int | None, at: float) -> None:
        """This poll's reading of the primary's clock (None: no answer; nothing is dated
        until the next)."""
        self._next, self._at = next_xid, at
        if next_xid is None:
            return
        if self._xids.latest_lsn is not None and next_xid < self._xids.latest_lsn:
            self._xids = LsnClock(XID_CLOCK_POINTS)  # another server (a failover): its own IDs
        self._xids.record(next_xid, at)

    def age(self, xid: int) -> float | None:
        """Seconds since the clock passed the 32-bit ``xid``, at least, as of the last
        reading (None: no reading this poll, or not dated)."""
        if self._next is None:
            return None
        return self._xids.age(widen(xid, self._next), self._at)


def widen(xid: int, next_xid: int) -> int:
    """A 32-bit transaction ID as the 64-bit one it is: the latest at or before ``next_xid``
    with those low bits (a held ID is never ahead of the clock by more than the transactions
    still running; one that is counts as just handed out)."""
    behind = (next_xid - xid) % _XID_SPACE
    if behind >= _XID_SPACE // 2:  # ahead of the clock: a transaction still running
        return next_xid
    return next_xid - behind
