"""A lag oracle: the true staleness of every replica at every instant, for the tests.

A writer commits rows carrying a sequence number and logs when each commit was sent and
when it returned; a probe per replica reads the highest sequence number replayed, about
every 2 ms, and logs when it asked and when it was answered. One host, one monotonic
clock (the same CLOCK_MONOTONIC lagwatch uses). The truth at instant t is the age of the
oldest commit not yet replayed there, 0 when none; it holds under any load, bursty or
idle, where ``now() - pg_last_xact_replay_timestamp()`` is no truth at all.

The oracle never pretends to more precision than it has: a probe's answer is true at
some moment inside its round trip, and a commit happened somewhere inside its call. So
``truth(replica, t)`` is an interval: ``high`` uses the earliest the replica's progress
and the commit could have been, ``low`` the latest. An over-read is measured against
``high``, an under-read against ``low``.

Where other sessions commit too (the OLTP load), the oldest change a replica lacks may be
one of theirs, made in the gap between two of the writer's commits: older than the
writer's next commit by up to that gap, which a busy host stretches well past the writer's
period. What is proven then is only that it came after the writer's last commit the
replica has replayed: its commit record follows that one in the WAL, so it was written
after that commit was sent. ``OracleLog(others=True)`` takes that as ``high``.
"""

from __future__ import annotations

import bisect
import math
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from chaoscluster import ChaosCluster

WORKER = Path(__file__).with_name("oracle_worker.py")
TABLE = "lagwatch_oracle"


@dataclass(frozen=True)
class Truth:
    low: float
    high: float

    @property
    def mid(self) -> float:
        return (self.low + self.high) / 2


def tolerance(truth: float, absolute: float, relative: float) -> float:
    """``max(absolute, relative * truth)``: the issue's "max(5 ms, 10 %)" and kin."""
    return max(absolute, relative * truth)


def nearest_rank(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


class OracleLog:
    """What the writer and the probes logged, read at one moment."""

    def __init__(self, commits: list[tuple[int, float, float]], probes: dict[str, list[tuple[float, float, int]]],
                 others: bool = False):
        self.others = others  # other sessions commit too (see the module's docstring)
        self.commit_sent = {seq: sent for seq, sent, _ in commits}
        self.commit_done = {seq: done for seq, _, done in commits}
        self.first_commit_at = commits[0][1] if commits else None
        self.last_commit_at = commits[-1][2] if commits else None
        self.commit_times = [sent for _, sent, _ in commits]
        self._probes = {name: ([p[0] for p in rows], [p[1] for p in rows], [p[2] for p in rows])
                        for name, rows in probes.items()}

    def covers(self, replica: str, t: float) -> bool:
        asked, answered, _ = self._probes[replica]
        return bool(answered) and answered[0] <= t <= asked[-1]

    def replayed(self, replica: str, t: float) -> tuple[int, int]:
        """Bounds on the highest sequence number replayed at ``t``: at least what a probe
        answered by then, at most what the next probe asked after it saw."""
        asked, answered, seen = self._probes[replica]
        i = bisect.bisect_right(answered, t)
        at_least = seen[i - 1] if i else 0
        j = bisect.bisect_left(asked, t)
        at_most = seen[j] if j < len(seen) else max(seen[-1] if seen else 0, at_least)
        return at_least, max(at_least, at_most)

    def truth(self, replica: str, t: float) -> Truth:
        at_least, at_most = self.replayed(replica, t)

        def age(replayed: int, when: dict[int, float]) -> float:
            committed = when.get(replayed + 1)
            return 0.0 if committed is None or committed > t else t - committed

        if not self.others:
            return Truth(low=age(at_most, self.commit_done), high=age(at_least, self.commit_sent))
        replayed_sent = self.commit_sent.get(at_least)
        high = t - replayed_sent if replayed_sent is not None and replayed_sent <= t else \
            age(at_least, self.commit_sent)
        return Truth(low=age(at_most, self.commit_done), high=high)

    def commits_between(self, start: float, end: float) -> int:
        return bisect.bisect_left(self.commit_times, end) - bisect.bisect_left(self.commit_times, start)


class LagOracle:
    """Starts the writer and one probe per replica (separate processes, bounded in time).
    With ``probes=False`` it is only a steady (or bursty) writer."""

    def __init__(self, cluster: ChaosCluster, folder: Path, *, rate: float = 200.0, burst_on: float = 0.0,
                 burst_off: float = 0.0, max_seconds: float = 180.0, probes: bool = True) -> None:
        self.cluster = cluster
        self.folder = folder
        self.rate, self.burst_on, self.burst_off = rate, burst_on, burst_off
        self.max_seconds = max_seconds
        self._writer: subprocess.Popen[str] | None = None
        self._probes: list[subprocess.Popen[str]] = []
        self.commit_log = folder / "commits.log"
        self.probe_logs = {r.name: folder / f"probe-{r.name}.log" for r in cluster.replicas} if probes else {}

    def _spawn(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, str(WORKER), *args], stdin=subprocess.PIPE, text=True)

    def __enter__(self) -> LagOracle:
        self.folder.mkdir(parents=True, exist_ok=True)
        # No autovacuum on it: its commits would break the silences the tests make.
        self.cluster.primary.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (seq bigint PRIMARY KEY) "
                                     "WITH (autovacuum_enabled = off)")
        self.cluster.wait_replayed()
        for r in self.cluster.replicas:
            if r.name in self.probe_logs:
                self._probes.append(self._spawn("probe", r.dsn(), str(self.probe_logs[r.name]),
                                                str(self.max_seconds)))
        self._wait_for_lines(self.probe_logs.values())
        self.start_writes()
        return self

    def start_writes(self) -> None:
        if self._writer is not None:
            self.stop_writes()
        self._writer = self._spawn("write", self.cluster.primary.dsn(), str(self.commit_log), str(self.rate),
                                   str(self.burst_on), str(self.burst_off), str(self.max_seconds))
        self._wait_for_lines([self.commit_log])

    def stop_writes(self) -> float:
        """Stop the writer; returns when its last commit returned (monotonic)."""
        if self._writer is not None:
            _close(self._writer)
            self._writer = None
        log = self.read()
        assert log.last_commit_at is not None
        return log.last_commit_at

    def __exit__(self, *exc: object) -> None:
        for proc in [self._writer, *self._probes]:
            if proc is not None:
                _close(proc)
        self._writer, self._probes = None, []

    def read(self, others: bool = False) -> OracleLog:
        """What was logged so far; ``others``: sessions other than the writer committed
        meanwhile (OracleLog)."""
        commits = [(int(s), float(a), float(b)) for s, a, b in _rows(self.commit_log)]
        probes = {name: [(float(a), float(b), int(s)) for a, b, s in _rows(path)]
                  for name, path in self.probe_logs.items()}
        return OracleLog(commits, probes, others)

    @staticmethod
    def _wait_for_lines(paths: object, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        for path in paths:  # type: ignore[attr-defined]
            while not (path.exists() and path.stat().st_size > 0):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"oracle worker wrote nothing to {path} within {timeout}s")
                time.sleep(0.01)


def _rows(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    text = path.read_text()
    # The last line may be half written: keep complete lines only.
    return [line.split() for line in text[:text.rfind("\n") + 1].splitlines()]


def _close(proc: subprocess.Popen[str]) -> None:
    stdin: IO[str] | None = proc.stdin
    if stdin is not None:
        stdin.close()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
