"""A replica's staleness over time: the window of recent samples and its quantiles, and the
histogram of every sample since start (the cycles' durations are kept the same way).

The window keeps its samples sorted, so a 5-minute window of 6,000 samples costs nothing
per cycle, and hands each snapshot a view of its arrays rather than a copy. Pure: time
comes in as an argument.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import overload

from lagwatch.estimate.nativehistogram import NativeCounts, NativeHistogram
from lagwatch.fastinit import fast_init

# Histogram buckets, 0.5 ms to 10 min: fine where lag SLAs sit (tens of milliseconds),
# coarse beyond, so PromQL can aggregate across replicas and time.
LAG_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
    0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)
QUANTILES: tuple[float, ...] = (0.5, 0.95, 0.99, 1.0)
# Cycle durations, 1 ms to 10 s: fine from a 50 ms interval's cycles to a fleet's hundreds
# of milliseconds, so that "p99 under half the interval" is one PromQL expression.
CYCLE_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
)


@fast_init
@dataclass(frozen=True)
class WindowStats:
    """Quantiles of staleness over the window (nearest-rank, so each is a real sample)."""

    count: int
    quantiles: tuple[tuple[float, float], ...]  # (q, value) for q in QUANTILES

    def get(self, q: float) -> float:
        return dict(self.quantiles)[q]

    @property
    def p95(self) -> float:
        return self.get(0.95)


def nearest_rank(sorted_values: Sequence[float], q: float) -> float:
    """The smallest sample with at least ``q`` of the samples at or below it."""
    if not sorted_values:
        raise ValueError("no samples")
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


class LagSamples(Sequence[tuple[float, float]]):
    """One window's (time, staleness) samples at one moment, oldest first: a read-only view.

    Every cycle's snapshot carries one per replica, so it is a view, not a copy: positions
    ``start`` to ``stop`` of the window's arrays, which the window only ever appends to (it
    replaces its arrays to drop old samples, never edits them), so what a view covers
    stays as it was however long a snapshot is kept. (Kept as pairs of floats, a fleet of
    600 replicas with 5-minute windows at 1 s held ~20 MB; copied into each snapshot, the
    arrays would be 3 MB more to allocate and free every cycle.)
    """

    __slots__ = ("_start", "_stop", "_times", "_values")

    def __init__(self, times: array[float] | None = None, values: array[float] | None = None,
                 start: int = 0, stop: int | None = None) -> None:
        self._times = array("d") if times is None else times
        self._values = array("d") if values is None else values
        self._start = start
        self._stop = len(self._times) if stop is None else stop
        if not 0 <= self._start <= self._stop <= min(len(self._times), len(self._values)):
            raise ValueError("a view inside both arrays")

    def __len__(self) -> int:
        return self._stop - self._start

    @overload
    def __getitem__(self, index: int) -> tuple[float, float]: ...

    @overload
    def __getitem__(self, index: slice) -> LagSamples: ...

    def __getitem__(self, index: int | slice) -> tuple[float, float] | LagSamples:
        if isinstance(index, slice):
            first, last, step = index.indices(len(self))
            if step != 1:
                raise ValueError("LagSamples slices are contiguous")
            return LagSamples(self._times, self._values, self._start + first, self._start + max(first, last))
        i = index + len(self) if index < 0 else index
        if not 0 <= i < len(self):
            raise IndexError("sample index out of range")
        return self._times[self._start + i], self._values[self._start + i]

    def __iter__(self) -> Iterator[tuple[float, float]]:
        # islice, not a memoryview: an exported buffer would stop the window appending.
        return zip(islice(self._times, self._start, self._stop), islice(self._values, self._start, self._stop),
                   strict=True)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LagSamples):
            return list(self) == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"LagSamples({len(self)} samples)"


def window_samples(window: float, interval: float) -> int:
    """How many samples a window of ``window`` seconds keeps at most when polled every
    ``interval``: twice the polls it spans (a late cycle's answers, a shortened interval
    after a reload) and some to spare."""
    return math.ceil(window / interval) * 2 + 16


class LagWindow:
    """Samples of one replica's staleness over the last ``window`` seconds, bounded.

    The values are also kept sorted (insertion is a binary search and a memmove), so the
    quantiles cost nothing at short intervals, where a 5 minute window holds thousands.
    Typed arrays, not a deque of pairs: 24 bytes a sample instead of ~120 (a fleet of 600
    replicas holds 180,000 samples at 1 s).
    """

    def __init__(self, window: float, max_samples: int) -> None:
        self.window = window
        self.max_samples = max_samples
        # Appended to, never edited (LagSamples views read them): samples before _head
        # have left the window, and once they are half of the arrays, new arrays without
        # them replace these (one copy per window's worth of samples, not one per sample).
        self._times = array("d")
        self._values = array("d")
        self._head = 0
        self._sorted = array("d")

    def __len__(self) -> int:
        return len(self._times) - self._head

    def add(self, now: float, value: float) -> None:
        if len(self) >= self.max_samples:
            self._drop_oldest()
        self._times.append(now)
        self._values.append(value)
        bisect.insort(self._sorted, value)
        self._trim(now)

    def _drop_oldest(self) -> None:
        value = self._values[self._head]
        self._head += 1
        del self._sorted[bisect.bisect_left(self._sorted, value)]
        if self._head * 2 >= len(self._times):
            self._times = self._times[self._head:]
            self._values = self._values[self._head:]
            self._head = 0

    def _trim(self, now: float) -> None:
        while len(self) and self._times[self._head] < now - self.window:
            self._drop_oldest()

    def samples(self, now: float) -> LagSamples:
        self._trim(now)
        return LagSamples(self._times, self._values, self._head, len(self._times))

    def values(self, now: float) -> list[float]:
        self._trim(now)
        return self._values[self._head:].tolist()

    def stats(self, now: float) -> WindowStats | None:
        self._trim(now)
        if not self._sorted:
            return None
        return WindowStats(len(self._sorted), tuple((q, nearest_rank(self._sorted, q)) for q in QUANTILES))


@fast_init
@dataclass(frozen=True)
class HistogramCounts:
    """Cumulative counts per upper bound (Prometheus style, +Inf last), sum and count; and
    the same samples in a native histogram's buckets."""

    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]
    total: float
    count: int
    native: NativeCounts | None = None


class LagHistogram:
    """Every staleness sample since start, bucketed: a counter, never reset (the cycles'
    durations are kept the same way, with ``CYCLE_BUCKETS``); in the classic buckets
    (``bounds``) and in a native histogram's (estimate/nativehistogram.py) side by side,
    for the scrapers that take either."""

    def __init__(self, bounds: tuple[float, ...] = LAG_BUCKETS) -> None:
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self._sum = 0.0
        self._native = NativeHistogram()

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, value)] += 1
        self._sum += value
        self._native.observe(value)

    def snapshot(self) -> HistogramCounts:
        cumulative, running = [], 0
        for count in self._counts:
            running += count
            cumulative.append(running)
        return HistogramCounts(self._bounds + (math.inf,), tuple(cumulative), self._sum, running,
                               self._native.snapshot())
