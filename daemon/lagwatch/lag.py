"""Staleness without trusting clocks, its window quantiles and its histogram.

Each cycle records (primary's current LSN, our monotonic time). A replica's staleness is
how long ago the primary was first seen past the replica's replay LSN: the age of the
oldest change it has not replayed. It is 0 when the replica has replayed everything the
primary had, whatever the primary's commit timestamps or the hosts' clocks say, so it
stays 0 on an idle primary and keeps growing while replay is stalled.

Everything here is pure: time comes in as an argument.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

# Histogram buckets, 1 ms to 10 min, so PromQL can aggregate across replicas and time.
LAG_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)
QUANTILES: tuple[float, ...] = (0.5, 0.95, 0.99, 1.0)


class LsnClock:
    """When the primary was first seen at or past each LSN (monotonic seconds).

    Only advances are recorded, so an idle primary adds nothing. Bounded: when full, points
    are dropped where that under-reads any staleness by at most a small fraction of it
    (``resolution``, 1/64 to start: recent history stays exact to the poll, and a replica
    stuck for a day reads within ~1.6%). The first point always stays, so a replica stuck
    further back than the whole history reads the time since the history began, which
    still grows with wall time. Never over-reads.
    """

    def __init__(self, max_points: int) -> None:
        if max_points < 4:
            raise ValueError("max_points must be at least 4")
        self.max_points = max_points
        self._lsns: list[int] = []
        self._times: list[float] = []

    def record(self, lsn: int, now: float) -> None:
        if self._lsns and lsn <= self._lsns[-1]:
            return
        if len(self._lsns) >= self.max_points:
            self._thin(now)
        self._lsns.append(lsn)
        self._times.append(now)

    def _thin(self, now: float) -> None:
        # Runs when full and leaves at most 3/4 of the capacity: amortised O(1) per record.
        resolution = 1 / 64
        while True:
            lsns, times = _thinned(self._lsns, self._times, resolution, now)
            if len(lsns) <= self.max_points * 3 // 4:
                break
            resolution *= 2
        self._lsns, self._times = lsns, times

    @property
    def latest_lsn(self) -> int | None:
        return self._lsns[-1] if self._lsns else None

    def __len__(self) -> int:
        return len(self._lsns)

    def reaches_back_to(self, lsn: int) -> bool:
        """Whether the history starts at or before ``lsn``: if not (lagwatch started, or
        restarted its clock, after the primary passed it), ``staleness`` is only a lower
        bound, the time since the history began."""
        return bool(self._lsns) and lsn >= self._lsns[0]

    def staleness(self, replay_lsn: int, now: float) -> float | None:
        """Seconds since the primary was first seen past ``replay_lsn``; 0 if it never was.

        None only before the primary has been seen at all.
        """
        if not self._lsns:
            return None
        # First recorded point strictly past what the replica has replayed.
        index = bisect.bisect_right(self._lsns, replay_lsn)
        if index == len(self._lsns):
            return 0.0
        return max(0.0, now - self._times[index])


def _thinned(lsns: list[int], times: list[float], resolution: float, now: float) -> tuple[list[int], list[float]]:
    """The points worth keeping. Dropping point i makes replay LSNs in (lsn[i-1], lsn[i]]
    date from the next kept point instead: under-read by at most that point's time minus
    t[i-1]. A point goes only when that gap is within ``resolution`` of the staleness such
    a replica would read. The first and the last point always stay."""
    if len(lsns) < 3:
        return list(lsns), list(times)
    kept_lsns, kept_times = [lsns[-1]], [times[-1]]  # built newest to oldest
    for i in range(len(lsns) - 2, 0, -1):
        following = kept_times[-1]
        if following - times[i - 1] <= resolution * (now - following):
            continue
        kept_lsns.append(lsns[i])
        kept_times.append(times[i])
    kept_lsns.append(lsns[0])
    kept_times.append(times[0])
    return kept_lsns[::-1], kept_times[::-1]


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


class LagWindow:
    """Samples of one replica's staleness over the last ``window`` seconds, bounded."""

    def __init__(self, window: float, max_samples: int) -> None:
        self.window = window
        self._samples: deque[tuple[float, float]] = deque(maxlen=max_samples)

    def add(self, now: float, value: float) -> None:
        self._samples.append((now, value))
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self._samples and self._samples[0][0] < now - self.window:
            self._samples.popleft()

    def samples(self, now: float) -> tuple[tuple[float, float], ...]:
        self._trim(now)
        return tuple(self._samples)

    def values(self, now: float) -> list[float]:
        self._trim(now)
        return [v for _, v in self._samples]

    def stats(self, now: float) -> WindowStats | None:
        values = sorted(self.values(now))
        if not values:
            return None
        return WindowStats(len(values), tuple((q, nearest_rank(values, q)) for q in QUANTILES))


@dataclass(frozen=True)
class HistogramCounts:
    """Cumulative counts per upper bound (Prometheus style, +Inf last), sum and count."""

    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]
    total: float
    count: int


class LagHistogram:
    """Every staleness sample since start, bucketed: a counter, never reset."""

    def __init__(self, bounds: tuple[float, ...] = LAG_BUCKETS) -> None:
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, value)] += 1
        self._sum += value

    def snapshot(self) -> HistogramCounts:
        cumulative, running = [], 0
        for count in self._counts:
            running += count
            cumulative.append(running)
        return HistogramCounts(self._bounds + (math.inf,), tuple(cumulative), self._sum, running)
