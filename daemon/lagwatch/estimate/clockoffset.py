"""Lagwatch's monotonic clock less another host's wall clock, from that host's answers.

An answer carries the clock the server read while running the statement, somewhere between
when lagwatch sent it and when the answer came back. So ``sent - clock`` is never more than
the true offset, and ``answered - clock`` never less: the quickest answer bounds it
tightest. Each bound is the most (or least) of its answers over the last WINDOW seconds:
long enough to hold a quick answer at any interval, short enough that a slewing clock
moves it by a millisecond or two at most. Used from below for when a replica's answer was
true (readinstant.py), from above for when the primary made a commit (estimate/clock.py).

Hand-written: a sliding window's extreme is a dozen lines (a deque kept in order, O(1)
amortised an answer), less than a dependency would cost.
"""

from __future__ import annotations

from collections import deque
from typing import Literal

WINDOW = 10.0


class ClockOffset:
    """One bound on the offset: ``at_least`` from the moments questions were sent, the most
    of them; ``at_most`` from the moments answers came, the least."""

    def __init__(self, side: Literal["at_least", "at_most"], window: float = WINDOW) -> None:
        self.window = window
        self._sign = -1.0 if side == "at_least" else 1.0
        # (when, sign * offset), the second strictly increasing: each kept value is the
        # bound once every one before it has left the window.
        self._kept: deque[tuple[float, float]] = deque()

    def note(self, at: float, offset: float) -> float:
        """One answer's ``offset`` (``at`` on lagwatch's clock, never earlier than the one
        before); the bound over the window that ends there."""
        value = self._sign * offset
        while self._kept and self._kept[-1][1] >= value:
            self._kept.pop()
        self._kept.append((at, value))
        while self._kept[0][0] < at - self.window:
            self._kept.popleft()
        return self._sign * self._kept[0][1]

    @property
    def bound(self) -> float | None:
        """The bound as of the last answer noted (None before any)."""
        return self._sign * self._kept[0][1] if self._kept else None
