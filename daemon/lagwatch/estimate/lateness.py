"""Whose lateness is it: the node's, or lagwatch's own.

A monitor that is itself late (a busy host, a fleet too big for the interval, a pause)
must not read its own lateness as the nodes': that is how a busy lagwatch once closed
healthy sessions, reconnected at more cost, fell further behind, and read a whole fleet
down. Three pieces:

- ``LoopLag`` measures how late lagwatch's event loop is to do what it was waiting to do:
  a timer asks to run every ``TICK`` seconds and counts how late it runs. Time the loop was
  that late is time lagwatch was not listening; the rest is its *attention*. A deadline
  counted in attention (``attentive``) does not pass while lagwatch is the late one.
- ``judge_unanswered`` (pure) says why a node's answer is not in when a cycle stops
  waiting: ``late`` (it answered, or lagwatch gave it too little attention to say it did
  not: no evidence either way), ``connecting`` (its first connection is under way: no
  evidence yet), or ``silent`` (lagwatch listened and it said nothing: evidence).
- ``Pacer`` (pure) stretches the interval lagwatch keeps when its cycles do not fit the
  configured one, and relaxes it again as soon as they do, instead of letting cycles
  pile up behind each other.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

TICK = 0.05  # seconds between the loop-lag timer's runs
# Lateness below this is the loop's ordinary jitter, not a stall.
GRACE = 0.005
# A node is silent only once lagwatch gave it this share of the cycle's budget of its
# attention since asking: a node had that long, and lagwatch was there to hear it.
SILENT_AFTER = 0.5

Verdict = Literal["late", "connecting", "silent"]


class LoopLag:
    """How late the event loop runs what is due: the sum of every stall since start (each
    tick's lateness beyond ``GRACE``) and the worst since last asked. Costs one timer
    callback every ``TICK`` seconds; reads nothing until ``start`` (then nothing is late)."""

    def __init__(self, tick: float = TICK, grace: float = GRACE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.tick = tick
        self.grace = grace
        self._clock = clock  # asyncio's own clock (BaseEventLoop.time); a test passes its own
        self._stalled = 0.0
        self._worst = 0.0
        self._due: float | None = None  # monotonic time the next tick is due; None: not running
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._schedule(self._clock())

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle, self._due = None, None

    def _schedule(self, now: float) -> None:
        assert self._loop is not None
        self._due = now + self.tick
        self._handle = self._loop.call_at(self._due, self._ticked)

    def _ticked(self) -> None:
        now = self._clock()
        assert self._due is not None
        late = now - self._due
        if late > self.grace:
            self._stalled += late
            self._worst = max(self._worst, late)
        self._schedule(now)

    def stalled(self, now: float) -> float:
        """Seconds the loop has been late since start, including a stall under way now
        (a tick overdue that the loop has not got to yet)."""
        if self._due is None:
            return self._stalled
        overdue = now - self._due
        return self._stalled + (overdue if overdue > self.grace else 0.0)

    def mark(self, now: float) -> tuple[float, float]:
        """A moment to count attention from (``attentive``)."""
        return now, self.stalled(now)

    def attentive(self, since: tuple[float, float], now: float) -> float:
        """Seconds of ``now - since`` in which lagwatch was not stalled."""
        at, stalled = since
        return max(0.0, (now - at) - (self.stalled(now) - stalled))

    def take_worst(self, now: float) -> float:
        """The worst lateness since the last call (an overdue tick counts as it stands)."""
        overdue = now - self._due if self._due is not None else 0.0
        worst, self._worst = max(self._worst, overdue if overdue > self.grace else 0.0), 0.0
        return worst


def judge_unanswered(*, first_connection: bool, answer_waiting: bool, attentive: float,
                     budget: float) -> Verdict:
    """Why a node's answer is not in when the cycle stops waiting for it.

    ``first_connection``: lagwatch has had no answer from it since it started polling it
    (its first connection is under way or waiting its turn). ``answer_waiting``: its socket
    has bytes to read, or libpq has a whole result that lagwatch has not taken yet.
    ``attentive``: seconds of lagwatch's attention since it asked (or began connecting).
    """
    if first_connection:
        return "connecting"
    if answer_waiting or attentive < SILENT_AFTER * budget:
        return "late"
    return "silent"


# The effective interval: cycles must fit it with this much to spare...
HEADROOM = 1.25
# ...over the longest of the last few cycles (one cycle that happened to fit does not
# undo a stretch at once; one slow cycle stretches at once)...
PACE_CYCLES = 3
# ...and never more than this many configured intervals (past that lagwatch is simply
# too slow for its fleet, and says so: LagwatchOverloaded).
MAX_STRETCH = 10.0
# Changes smaller than this share of the configured interval are not worth a reschedule.
PACE_STEP = 0.1
# A loop lag below this share of the configured interval is lagwatch on time again: a cycle
# that then fits the configured interval ends a stretch at once (a host no longer busy).
PUNCTUAL = 0.1


@dataclass(frozen=True)
class Pace:
    interval: float  # the interval to keep now
    overloaded: bool  # stretched beyond the configured one


class Pacer:
    """The interval lagwatch keeps: the configured one while cycles fit it, else the longest
    recent cycle plus headroom (up to MAX_STRETCH intervals). A cycle that took longer than
    the interval then in force stretches it at once; once the recent cycles fit again it
    relaxes to what they need, and at once to the configured one when a cycle fits that and
    lagwatch was on time in it (its loop lag small: the host is no longer busy). A cycle's
    length here is lagwatch's: waiting on a node that does not answer ends at the cycle's
    budget (below the interval), so a hung node never stretches anything. Pure: durations
    and loop lags in, the pace out."""

    def __init__(self, configured: float) -> None:
        self.configured = configured
        self._recent: deque[float] = deque(maxlen=PACE_CYCLES)
        self.pace = Pace(configured, False)

    def observe(self, duration: float, loop_lag: float = 0.0) -> Pace:
        self._recent.append(duration)
        need = max(self._recent) * HEADROOM
        current = self.pace.interval
        if duration > current:  # did not fit: stretch now
            wanted = need
        elif current > self.configured and duration * HEADROOM <= self.configured \
                and loop_lag <= PUNCTUAL * self.configured:
            wanted = self.configured  # on time again
        elif need < current:  # the recent cycles fit a shorter one: relax towards it
            wanted = need
        else:
            return self.pace
        wanted = min(max(wanted, self.configured), self.configured * MAX_STRETCH)
        if abs(wanted - current) < PACE_STEP * self.configured and wanted != self.configured:
            return self.pace
        if wanted > self.configured:
            # Whole tenths of the configured interval: a steady load keeps one pace.
            step = PACE_STEP * self.configured
            wanted = min(math.ceil(wanted / step) * step, self.configured * MAX_STRETCH)
        self.pace = Pace(wanted, wanted > self.configured)
        return self.pace
