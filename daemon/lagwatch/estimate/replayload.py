"""How close a replica's replay is to its limit: the share of recent time its startup
process (the one process that replays) spent working rather than waiting, and what it read.

Sampled once a cycle (views/recovery.py), so the share is a count of samples over the
window: at ``interval: 1s`` and a 60 s window, 60 samples (a share's standard error up
to ±6.5 points); at 100 ms, 600 (±2). Waiting for WAL, for recovery_min_apply_delay, on a
pause or on a query's conflict count as not working: a replica held back by any of those
is not short of replay capacity. Pure and bounded: samples older than the window go. ``ConflictTotals`` keeps the
conflicts' counters monotonic.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from lagwatch.fastinit import fast_init
from lagwatch.views.recovery import Recovery


@fast_init
@dataclass(frozen=True)
class ReplayLoad:
    busy_ratio: float | None  # share of samples that found the startup process working (None: none yet)
    samples: int
    read_rate: float | None = None  # blocks a second the startup process read over the window (16+)
    startup_reads: int | None = None  # the last count read (pg_stat_io: one poll in ten, views/recovery.py)


class ReplayLoadTracker:
    def __init__(self, window: float) -> None:
        self.window = window
        self._samples: dict[str, deque[tuple[float, bool, int | None]]] = {}

    def note(self, replica: str, at: float, recovery: Recovery | None) -> ReplayLoad | None:
        """Take this cycle's sample of ``replica`` (read at ``at``); its load over the window.
        None until the startup process has been seen."""
        samples = self._samples.get(replica)
        if recovery is not None and recovery.activity is not None:
            if samples is None:
                samples = self._samples[replica] = deque()
            if samples and at <= samples[-1][0]:
                return self._load(samples)  # the same answer again (a late poll taken twice)
            samples.append((at, recovery.activity == "working", recovery.startup_reads))
        if samples is None:
            return None
        while samples and samples[0][0] < at - self.window:
            samples.popleft()
        return self._load(samples) if samples else None

    @staticmethod
    def _load(samples: deque[tuple[float, bool, int | None]]) -> ReplayLoad:
        busy = sum(1 for _, working, _ in samples if working)
        # The read counts come on some polls only: the rate is between the first and the
        # last that have one (a reset, the count going back, gives none).
        counted = [(t, reads) for t, _, reads in samples if reads is not None]
        rate = None
        if len(counted) >= 2 and counted[-1][1] >= counted[0][1] and counted[-1][0] > counted[0][0]:
            rate = (counted[-1][1] - counted[0][1]) / (counted[-1][0] - counted[0][0])
        return ReplayLoad(busy / len(samples), len(samples), rate, counted[-1][1] if counted else None)

    def forget(self, replica: str) -> None:
        self._samples.pop(replica, None)


class ConflictTotals:
    """Each replica's cancelled queries by conflict type as counters that never go back.
    pg_stat_database_conflicts is summed over databases, and the sum falls when a database
    is dropped (the drop replays on the replica) or one's statistics are reset: exported as
    it is, Prometheus would take the fall for a counter reset and count the whole remaining
    total again. Only rises are added; a fall moves the baseline."""

    def __init__(self) -> None:
        self._seen: dict[str, dict[str, int]] = {}  # replica -> type -> last sum read
        self._totals: dict[str, dict[str, int]] = {}

    def note(self, replica: str, counts: Mapping[str, int] | None) -> Mapping[str, int]:
        totals = self._totals.setdefault(replica, {})
        if counts is None:
            return dict(totals)
        seen = self._seen.setdefault(replica, {})
        for kind, count in counts.items():
            before = seen.get(kind)
            totals[kind] = totals.get(kind, 0) + (count if before is None else max(0, count - before))
            seen[kind] = count
        return dict(totals)

    def forget(self, replica: str) -> None:
        self._seen.pop(replica, None)
        self._totals.pop(replica, None)
