"""How close a replica's replay is to its limit: the share of recent time its startup
process (the one process that replays) spent working rather than waiting, and what it read.

Sampled once a cycle (views/recovery.py), so the share is a count of samples over the
window: at ``interval: 1s`` and a 60 s window, 60 samples (a share's standard error up
to ±6.5 points); at 100 ms, 600 (±2). Waiting for WAL, for recovery_min_apply_delay, on a
pause or on a query's conflict count as not working: a replica held back by any of those
is not short of replay capacity. Pure and bounded: samples older than the window go.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from lagwatch.fastinit import fast_init
from lagwatch.views.recovery import Recovery


@fast_init
@dataclass(frozen=True)
class ReplayLoad:
    busy_ratio: float | None  # share of samples that found the startup process working (None: none yet)
    samples: int
    read_rate: float | None = None  # blocks a second the startup process read over the window (16+)


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
        (t0, _, r0), (t1, _, r1) = samples[0], samples[-1]
        rate = (r1 - r0) / (t1 - t0) if r0 is not None and r1 is not None and r1 >= r0 and t1 > t0 else None
        return ReplayLoad(busy / len(samples), len(samples), rate)

    def forget(self, replicas: list[str]) -> None:
        for name in replicas:
            self._samples.pop(name, None)
