"""One cluster's lag history: the LSN clock, each replica's window, histogram and last known
replay position, and the primary's transaction rate, with the staleness reading they give.

Everything it keeps is bounded; no I/O, no clock of its own: positions come with the
monotonic times they were read at (estimate/dating.py dates a reading).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

from lagwatch.estimate.dating import Dated, Known, Stands, date, gather
from lagwatch.estimate.lsnclock import Commits, LsnClock, WalDates
from lagwatch.estimate.windows import HistogramCounts, LagHistogram, LagSamples, LagWindow, WindowStats, window_samples
from lagwatch.fastinit import fast_init
from lagwatch.lsn import format_lsn
from lagwatch.views.replication import WalSender

log = logging.getLogger("lagwatch.estimate.tracker")

# The LSN clock's bound. The clock thins itself whenever it has doubled since it was last
# thinned, keeping the last 64 polls exact and older history to 1/64 of its age. Thinning
# again what was thinned before keeps more points than needed, so it grows with uptime,
# slowly: simulated at one poll a second it holds ~370 points on average over its first
# half hour, ~900 over a day, ~1,130 over a week, and 1,536 keep 1/64 through 5 million
# polls (58 days at 1 s, 14 hours at 10 ms). Past that, the resolution halves rather than
# the bound growing: at most 12 MB of clocks for 300 clusters.
CLOCK_MAX_POINTS = 1536
# Replicas gone from the output whose history is kept for one window (one that comes back,
# a Patroni member missing from an answer or two, keeps its window): at most this many, the
# longest gone dropped first, so that a Patroni renaming its members in every answer cannot
# grow lagwatch (each name was kept a window: 800 names a minute of churn, ~2 KB each).
DEPARTED_KEPT = 32
# The primary's transaction rate is taken over spans of at least XACT_MIN_SPAN_SECONDS
# ending at the last poll, within this horizon: its counters reach pg_stat_database up to
# a second late and in lumps.
XACT_HORIZON_SECONDS = 30.0
XACT_MIN_SPAN_SECONDS = 2.0


@fast_init
@dataclass(frozen=True)
class ReplayPosition:
    """Where a replica's replay stood, when, and who said so."""

    lsn: int
    at: float
    source: str  # replica | primary | last_known
    commits: Commits | None = None  # what commit timestamps say (only with the replica's own answer)
    wal: WalDates | None = None  # what the primary's WAL says past its walsender's replay position
    beat: tuple[float, float | None] | None = None  # the heartbeat's bounds at ``at`` (beats.Beats.bounds)


@fast_init
@dataclass(frozen=True)
class LagReading:
    """A replica's staleness as this cycle reads it, and its window (ReplicaState's fields,
    each passed on by name: tracker.replica_state)."""

    staleness: float | None
    staleness_source: str | None
    staleness_evidence: str | None
    staleness_bound: str | None
    staleness_at: float | None
    replay_lsn: int | None
    window: WindowStats | None
    histogram: HistogramCounts
    samples: LagSamples


class LagHistory:
    def __init__(self, cluster: str, interval: float, window: float) -> None:
        self.cluster = cluster
        self.interval = interval
        self.window = window
        self.clock = LsnClock(CLOCK_MAX_POINTS)
        self._window_samples = window_samples(window, interval)
        self._windows: dict[str, LagWindow] = {}
        self._histograms: dict[str, LagHistogram] = {}
        self._last_replay: dict[str, int] = {}
        self._last_seen: dict[str, float] = {}
        self._last_reading: dict[str, tuple[Dated, str, float]] = {}  # what, from whom, when
        self._xacts: deque[tuple[float, float]] = deque()

    # -- the primary ----------------------------------------------------------------------

    def record_primary(self, lsn: int, observed_at: float, asked_at: float | None, fork_lsn: int | None) -> bool:
        """The primary's position at this poll, on the LSN clock. True when it went back (a
        failover to a replica that had not received everything, or a restore): the history
        up to the new position (or the fork, where a promotion was seen) is shared and keeps
        its times; past it, it was never this primary's, and keeping it would make caught-up
        replicas look stale, so it is forgotten."""
        latest = self.clock.latest_lsn
        went_back = latest is not None and lsn < latest
        if went_back:
            cut = min(lsn, fork_lsn) if fork_lsn is not None else lsn
            log.warning("%s: the primary's WAL position went back from %s to %s (failover or restore?); "
                        "forgetting the LSN history past %s", self.cluster, format_lsn(latest or 0),
                        format_lsn(lsn), format_lsn(cut))
            self.clock.truncate(cut)
            self._last_replay = {name: min(last, cut) for name, last in self._last_replay.items()}
            self._xacts.clear()
        self.clock.record(lsn, observed_at, asked_at)
        return went_back

    def note_xacts(self, at: float, total: float | None) -> None:
        if total is None or (self._xacts and total < self._xacts[-1][1]):
            self._xacts.clear()  # unknown, or the statistics were reset
        if total is not None:
            self._xacts.append((at, total))
        while self._xacts and self._xacts[0][0] < at - XACT_HORIZON_SECONDS:
            self._xacts.popleft()

    def forget_xacts(self) -> None:
        """Another server's counters: a rate over both would mean nothing."""
        self._xacts.clear()

    def commit_interval(self) -> float:
        """The primary's time between transactions lately (0 when unknown): the shortest
        mean over the spans that end at the last poll. Read-only transactions count too, so
        it is never longer than the time between commits that write; and the shortest span
        that shows the current rate wins, so a stream that just began after an idle spell
        is not taken for as sparse as the spell (a longer mean there would be subtracted
        from the commit estimate and read the lag low)."""
        if len(self._xacts) < 2:
            return 0.0
        t1, n1 = self._xacts[-1]
        best = 0.0
        for t0, n0 in self._xacts:
            if t1 - t0 < XACT_MIN_SPAN_SECONDS:
                break
            if n1 > n0:
                interval = (t1 - t0) / (n1 - n0)
                best = interval if best == 0.0 else min(best, interval)
        return best

    # -- replicas -------------------------------------------------------------------------

    def last_known(self, replica: str, at: float) -> ReplayPosition | None:
        """Where the replica was last known to replay: nobody can say where it is now; it is
        at least as far behind as then, and that keeps growing while the primary writes."""
        lsn = self._last_replay.get(replica)
        return None if lsn is None else ReplayPosition(lsn, at, "last_known")

    def reading(self, replica: str, replay: ReplayPosition | None, sender: WalSender | None,
                now: float) -> LagReading:
        """This cycle's reading of ``replica`` (estimate/dating.py dates it) and its window."""
        window = self._windows.setdefault(replica, LagWindow(self.window, self._window_samples))
        histogram = self._histograms.setdefault(replica, LagHistogram())
        self._last_seen[replica] = now
        measured = None
        if replay is not None:
            self._last_replay[replica] = replay.lsn
            dated = date(self._known(replay, sender), standing=replica in self._last_reading)
            if isinstance(dated, Stands):
                measured = self._last_reading[replica]
            elif dated is not None:
                measured = self._last_reading[replica] = (dated, replay.source, replay.at)
                window.add(replay.at, dated.seconds)
                histogram.observe(dated.seconds)
        return LagReading(
            staleness=measured[0].seconds if measured is not None else None,
            staleness_source=measured[1] if measured is not None else None,
            staleness_evidence=measured[0].evidence if measured is not None else None,
            staleness_bound=measured[0].bound if measured is not None else None,
            staleness_at=measured[2] if measured is not None else None,
            replay_lsn=replay.lsn if replay is not None else None,
            window=window.stats(now),
            histogram=histogram.snapshot(),
            samples=window.samples(now),
        )

    def _known(self, replay: ReplayPosition, sender: WalSender | None) -> Known:
        return gather(self.clock, replay.lsn, replay.at, commits=replay.commits, wal=replay.wal,
                      walsender_lag=sender.lag_seconds("replay") or 0.0 if sender is not None else None,
                      heartbeat=replay.beat, interval=self.interval)

    def forget_vanished(self, present: set[str], now: float) -> list[str]:
        """A replica that stopped streaming drops out of the output at once; its history is
        kept one window in case it comes back, then dropped so memory stays bounded, and
        only for the DEPARTED_KEPT last gone. Returns the replicas forgotten."""
        absent = sorted((seen, n) for n, seen in self._last_seen.items() if n not in present)
        recent = [n for seen, n in absent if seen >= now - self.window]
        gone = [n for seen, n in absent if seen < now - self.window] + recent[:max(0, len(recent) - DEPARTED_KEPT)]
        for name in gone:
            for table in (self._windows, self._histograms, self._last_replay, self._last_seen, self._last_reading):
                table.pop(name, None)
        return gone
