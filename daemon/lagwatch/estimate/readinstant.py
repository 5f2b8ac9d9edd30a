"""When a replica's answer was true: the instant its replay position was read, on lagwatch's
monotonic clock, without trusting that host's clock to agree with ours.

A replica's poll is sent at ``asked`` and answered at ``observed``; its replay position
was read somewhere between, and a staleness dated at ``asked`` from a position read later
reads low by the gap: on a busy host, or a replica replaying a big transaction, tens of
milliseconds (and a replica that replays a hundred milliseconds of WAL in that gap reads
that much low). The replica's statement also reads its own clock at the same moment
(views/server.py's ``clock_epoch``). Our clock less its is at least ``asked - clock``
for every answer (the clock was read after the question was sent), so the bound from the
quickest answer of the last few seconds (clockoffset.py) is never more than the truth:
``clock + offset`` is never later than the true instant, and a staleness dated there is
never above the truth. It is held within [asked, observed] whatever the clocks do (a
clock stepped forward within the window could otherwise make it late).

Pure: the tracker passes each answer in.
"""

from __future__ import annotations

from lagwatch.estimate.clockoffset import ClockOffset


class ReadInstants:
    """The clock offsets of each replica's recent answers."""

    def __init__(self) -> None:
        self._offsets: dict[str, ClockOffset] = {}  # by replica: ours less its clock

    def instant(self, replica: str, asked: float, observed: float, clock_epoch: float | None) -> float:
        """When ``replica``'s answer (sent at ``asked``, back at ``observed``, its clock read
        at ``clock_epoch``) was true, as late as can be proven: ``asked`` without a clock."""
        if clock_epoch is None:
            return asked
        offset = self._offsets.setdefault(replica, ClockOffset("at_least")).note(asked, asked - clock_epoch)
        return min(max(clock_epoch + offset, asked), observed)

    def forget(self, replica: str) -> None:
        self._offsets.pop(replica, None)
