"""How long cycles take and whether they fit the interval: counts, durations, the pace.

The first cycle connects to every node: its duration is kept apart
(``lagwatch_first_cycle_duration_seconds``); every later one goes into the window of the
last CYCLE_HISTORY cycles (quantiles) and the histogram since start. A cycle longer than the
interval in force is an overrun; while cycles do not fit, the interval kept is stretched
(lateness.Pacer) and said in one WARNING a minute at most.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from lagwatch.durations import format_duration
from lagwatch.estimate.lateness import MAX_STRETCH, Pace, Pacer
from lagwatch.estimate.windows import CYCLE_BUCKETS, HistogramCounts, LagHistogram, nearest_rank

log = logging.getLogger("lagwatch.daemon")

CYCLE_HISTORY = 600  # cycles whose durations give lagwatch_cycle_duration_window_seconds
CYCLE_QUANTILES = (0.5, 0.9, 0.99, 1.0)
OVERLOAD_SAY_EVERY = 60.0  # seconds between two WARNINGs that cycles do not fit the interval


class CycleStats:
    def __init__(self, interval: float) -> None:
        self.cycles = 0
        self.overruns = 0
        self.first_cycle: float | None = None
        self._durations: deque[float] = deque(maxlen=CYCLE_HISTORY)
        self._histogram = LagHistogram(CYCLE_BUCKETS)
        self._pacer = Pacer(interval)
        self._said_overload_at: float | None = None  # when cycles last were said not to fit
        self._overruns_said = 0  # overruns when that was said

    @property
    def pace(self) -> Pace:
        return self._pacer.pace

    def new_interval(self, interval: float) -> None:
        """A reload's interval: kept as configured until cycles say otherwise."""
        self._pacer = Pacer(interval)

    def skipped(self) -> None:
        """A cycle that came while the last one still ran (the scheduler skipped it)."""
        self.overruns += 1

    def finished(self, duration: float, loop_lag: float) -> Pace | None:
        """Count a cycle that took ``duration``; returns the pace to keep if it changed."""
        self.cycles += 1
        if self.cycles > 1:
            self._durations.append(duration)
            self._histogram.observe(duration)
        else:
            self.first_cycle = duration
        before = self._pacer.pace
        if duration > before.interval:
            self.overruns += 1
        pace = self._pacer.observe(duration, loop_lag)
        self._say(before, pace, duration)
        return pace if pace.interval != before.interval else None

    def _say(self, before: Pace, pace: Pace, duration: float) -> None:
        configured = format_duration(self._pacer.configured)
        now = time.monotonic()
        if pace.overloaded:
            if self._said_overload_at is None or now - self._said_overload_at >= OVERLOAD_SAY_EVERY:
                log.warning("cycles do not fit the %s interval (the last took %s; %d overrun(s) since last said): "
                            "polling every %s until they do; lagwatch_effective_interval_seconds says how far behind",
                            configured, format_duration(duration), self.overruns - self._overruns_said,
                            format_duration(pace.interval))
                self._said_overload_at, self._overruns_said = now, self.overruns
        elif before.overloaded:
            log.info("cycles fit the %s interval again (the last took %s)", configured, format_duration(duration))
            self._said_overload_at = None

    def quantiles(self) -> tuple[tuple[float, float], ...]:
        ordered = sorted(self._durations)
        return tuple((q, nearest_rank(ordered, q)) for q in CYCLE_QUANTILES) if ordered else ()

    def histogram(self) -> HistogramCounts:
        return self._histogram.snapshot()


def watchdog_budget(interval: float, query_timeout: float) -> float:
    """How long systemd must wait for a WATCHDOG=1 (one a cycle): while cycles do not fit,
    lagwatch keeps up to MAX_STRETCH intervals between them, and one may take its whole
    interval plus the query timeout. A WatchdogSec= below that would get lagwatch
    restarted for being slow, so it is raised at runtime (WATCHDOG_USEC=, systemd 236+)."""
    return (MAX_STRETCH + 1) * interval + query_timeout
