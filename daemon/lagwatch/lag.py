"""Staleness without trusting clocks (its windows and histograms: windows.py).

Each cycle records (primary's current LSN, our monotonic time). A replica's staleness is
the age of the oldest change it has not replayed: ``now - W`` where W is when the primary
wrote the first byte after the replica's replay LSN. It is 0 when the replica has replayed
everything the primary had, whatever the primary's commit timestamps or the hosts' clocks
say, so it stays 0 on an idle primary and keeps growing while replay is stalled.

The LSN clock brackets W between two polls: the primary was last seen short of the byte
at one poll and first seen past it at the next. At a 1 s interval that bracket is a
second wide, so a finer reading combines it with what else is known (``estimate``):

- inside the bracket, W is interpolated by bytes, which is exact for a steady stream of
  writes. Only for a stream: not across a burst's edge (the primary was idle at the
  earlier poll, so the writes may have started anywhere in between), nor a jump in the
  WAL rate, and not unless the replica has lately replayed a commit from around there
  (one stray record after a quiet spell is no stream);
- commit timestamps (``Commits``, on the primary's own clock, so no two hosts' clocks are
  compared): what the replica lacks was written after the last commit it replayed, which
  caps the reading, and no later than a later commit another replica has replayed, which
  floors it;
- the bracket's lower end is the floor, and the answer when nothing finer is known.

Where lagwatch may read the primary's WAL (pg_walinspect), none of that is needed: the
first commit record past a replica's replay position is the oldest change a reader there
cannot see, and the commit time it carries dates it (``date_from_wal``), however bursty
the load or big the transaction. A change is what a reader can see: the records of a
transaction still running, or of one rolled back, are not missing from the replica's
answers until their commit is.

An over-read ejects a healthy replica, so every source is either a hard bound or is
clamped between hard bounds. Everything here is pure: time comes in as an argument.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from lagwatch.fastinit import fast_init

# Which evidence produced a reading (the ``lag_evidence`` label):
#   caught_up         the replica has replayed everything the primary was seen to write: 0
#   interpolated      by bytes between the two polls that bracket the first unreplayed byte
#   commit_timestamp  from commit timestamps: the last one the replica replayed, a later one it lacks
#   lsn_clock         the bracket's lower end: nothing finer is known (a burst just began)
#   history_start     behind lagwatch's history: time since the history began, a lower bound
#   walsender         behind lagwatch's history: the walsender's replay_lag, a better floor
#   wal_commit        from the WAL itself: the time of the first commit past the replay position
#   heartbeat         held to the bounds the heartbeat it has replayed gives (beats.py)
Evidence = Literal["caught_up", "interpolated", "commit_timestamp", "lsn_clock", "history_start", "walsender",
                   "wal_commit", "heartbeat"]


@fast_init
@dataclass(frozen=True)
class Staleness:
    seconds: float
    evidence: Evidence


@fast_init
@dataclass(frozen=True)
class Commits:
    """What commit timestamps say about one replica, on lagwatch's monotonic clock."""

    last_replayed: float | None = None  # the last commit this replica has replayed
    newest_seen: float | None = None  # the newest commit any replica has replayed
    interval: float = 0.0  # the primary's mean time between transactions lately (0: unknown)

    @property
    def lacks_newer(self) -> bool:
        """Whether the primary has committed since this replica's last replayed commit."""
        return self.last_replayed is not None and self.newest_seen is not None and self.newest_seen > self.last_replayed


@fast_init
@dataclass(frozen=True)
class WalDates:
    """What the primary's WAL says just past one walsender's replay position, on lagwatch's
    monotonic clock (commitscan.py reads it): every commit in [start, end)."""

    start: int
    end: int
    commits: tuple[tuple[int, float], ...]  # (start LSN of the commit record, monotonic time it was made)
    # Read up to where the primary had flushed when it was read: no commit past the last
    # listed had been made by then.
    complete: bool
    # Lagwatch's monotonic clock less the primary's wall clock, as the reads measured it
    # (never less than the truth: commitscan.CommitScanner.offset). 0.0: not measured.
    offset: float = 0.0


def date_from_wal(replay_lsn: int, at: float, dates: WalDates, replayed_at: float | None = None) -> Staleness | None:
    """The staleness at ``at`` of a replica that has replayed up to ``replay_lsn``, from the
    commits the primary's WAL holds past it; None when what was read does not cover it.

    The first commit at or past the replay position is the oldest change it lacks: its
    age is the staleness (0 if it was made after ``at``). With no commit there and the read
    complete (every commit the primary had made by then is listed or replayed), it lacks
    nothing a reader could see (0), short by at most what was committed between the read
    and ``at``. ``replayed_at``: when the last commit the replica has replayed was made
    (its commit timestamp): what it lacks was written after that one, so it became visible
    no earlier (see ``visible_commits``)."""
    if replay_lsn < dates.start:
        return None  # read from further on (its own position is older than its walsender's)
    floor = float("-inf") if replayed_at is None else replayed_at
    for lsn, visible in visible_commits(dates.commits):
        if lsn >= replay_lsn:
            return Staleness(max(0.0, at - max(visible, floor)), "wal_commit")
    return Staleness(0.0, "wal_commit") if dates.complete else None


def visible_commits(commits: Sequence[tuple[int, float]]) -> Iterator[tuple[int, float]]:
    """Each commit with the earliest it can have become visible: its time, or the time of a
    commit before it in the WAL, whichever is later. A commit's time is taken before its
    record is written, and on a primary busy writing WAL (a big transaction's full-page
    images) the record can land many milliseconds later, after commits stamped later: a
    reader sees none of it before the commits written ahead of it."""
    latest = float("-inf")
    for lsn, made in commits:
        latest = max(latest, made)
        yield lsn, latest


class LsnClock:
    """When the primary was first and last seen at each LSN it was polled at (monotonic s).

    Only advances add a point; a poll that finds the primary where it was only moves that
    point's ``last`` time, so an idle primary adds nothing. Thinned as it goes: points are
    dropped where that under-reads any staleness by at most a small fraction of it
    (``resolution``, 1/64: recent history stays exact to the poll, and a replica stuck for
    a day reads within ~1.6%), each time the clock has doubled since it was last thinned,
    so it holds about what that resolution needs (a few hundred points, growing with the
    log of its age) rather than filling up to ``max_points`` first. Bounded: if even that
    does not fit 3/4 of ``max_points``, the resolution halves. The first point always
    stays, so a replica stuck further back than the whole history reads the time since
    the history began, which still grows with wall time.
    """

    def __init__(self, max_points: int) -> None:
        if max_points < 4:
            raise ValueError("max_points must be at least 4")
        self.max_points = max_points
        # Thinned when it reaches this: twice what the last thinning kept (amortised O(1)
        # a record: each thinning walks the points added since the one before, and as many).
        self._thin_at = min(max_points, _THIN_FIRST_AT)
        # Typed arrays, not lists: 26 bytes a point instead of ~120 (the tracker's 1,536
        # points per cluster would be 55 MB in lists for a fleet of 300).
        self._lsns = array("Q")
        self._first = array("d")
        self._last = array("d")
        # _repeated[i]: point i was seen at more than one poll (the primary sat there idle).
        self._repeated = array("b")
        # _steady[i]: the primary was writing through the poll before point i (that point
        # was seen only once), so the bytes up to point i may be interpolated in time.
        self._steady = array("b")

    def record(self, lsn: int, now: float, asked: float | None = None) -> None:
        """The primary was at ``lsn`` at some moment between ``asked`` (when the query was
        sent; ``now`` if not given) and ``now`` (when its answer came): it was first seen
        there by ``now``, and still there at ``asked``."""
        asked = now if asked is None else min(asked, now)
        if self._lsns and lsn <= self._lsns[-1]:
            if lsn == self._lsns[-1]:
                self._last[-1] = max(self._last[-1], asked)
                self._repeated[-1] = 1
            return
        if len(self._lsns) >= self._thin_at:
            self._thin(now)
        steady = len(self._lsns) >= 2 and not self._repeated[-1]
        self._lsns.append(lsn)
        self._first.append(now)
        self._last.append(asked)
        self._repeated.append(0)
        self._steady.append(1 if steady else 0)

    def _thin(self, now: float) -> None:
        resolution = 1 / 64
        while True:
            kept = _kept_points(self._lsns, self._first, self._last, resolution, now)
            if len(kept) <= self.max_points * 3 // 4:
                break
            resolution *= 2
        # A merged interval may hide an idle stretch: it is no longer interpolated.
        self._steady = array("b", (1 if self._steady[j] and n > 0 and kept[n - 1] == j - 1 else 0
                                   for n, j in enumerate(kept)))
        self._lsns = array("Q", (self._lsns[j] for j in kept))
        self._first = array("d", (self._first[j] for j in kept))
        self._last = array("d", (self._last[j] for j in kept))
        self._repeated = array("b", (self._repeated[j] for j in kept))
        self._thin_at = min(self.max_points, max(_THIN_FIRST_AT, 2 * len(kept)))

    def truncate(self, lsn: int) -> None:
        """Forget the points past ``lsn``: the primary's WAL went back there (a failover to a
        replica that had not received all of it). What came before is shared history and
        keeps its times; what came after was never on the new timeline."""
        keep = bisect.bisect_right(self._lsns, lsn)
        for points in (self._lsns, self._first, self._last, self._repeated, self._steady):
            del points[keep:]

    def last_short_of(self, lsn: int) -> float | None:
        """The last time the primary was seen at or short of ``lsn`` (a record there or past
        it was written after that); None before the history reaches back that far."""
        k = bisect.bisect_right(self._lsns, lsn)
        return self._last[k - 1] if k > 0 else None

    @property
    def latest_lsn(self) -> int | None:
        return self._lsns[-1] if self._lsns else None

    def __len__(self) -> int:
        return len(self._lsns)

    def estimate(self, replay_lsn: int, now: float, commits: Commits | None = None) -> Staleness | None:
        """Staleness at ``now`` of a replica that has replayed up to ``replay_lsn``; None
        only before the primary has been seen at all."""
        if not self._lsns:
            return None
        commits = commits or Commits()
        last_commit = commits.last_replayed
        # A later commit than this replica's last (another replica has replayed it): the
        # primary has committed since, and what this one misses was written by then.
        later_commit = commits.newest_seen if commits.lacks_newer else None
        # The first point strictly past what the replica has replayed: the primary had
        # written the first unreplayed byte by then, and had not at the point before.
        k = bisect.bisect_right(self._lsns, replay_lsn)
        if k == len(self._lsns):
            return self._past_the_end(now, later_commit)
        lower: float = max(0.0, now - self._first[k])
        lower_evidence: Evidence = "lsn_clock"
        if later_commit is not None and now - later_commit > lower:
            lower, lower_evidence = now - later_commit, "commit_timestamp"
        # What the replica lacks became visible after the last commit it replayed: that
        # commit's age is a proven upper bound. The clock's own bounds date bytes, and the
        # bytes just past the replay position may be a big transaction's, written long
        # before the commit that makes them visible: they hold no further than this.
        proven = float("inf") if last_commit is None else max(0.0, now - last_commit)
        if lower > proven:
            lower, lower_evidence = proven, "commit_timestamp"
        if k == 0:
            return Staleness(lower, "history_start" if lower_evidence != "commit_timestamp" else lower_evidence)
        upper = min(now - self._last[k - 1], proven)
        lower = min(lower, upper)
        # What the replica misses came after the last commit it replayed: that commit's
        # age bounds the staleness from above. As an estimate it is high by the wait for
        # the next change, about one commit interval in a stream (the mean interval over
        # all the primary's transactions is no longer than that between the writing ones,
        # so taking it off does not go below the truth there).
        commit_estimate = None if last_commit is None else now - last_commit - commits.interval
        value: float
        evidence: Evidence
        if self._interpolable(k, last_commit):
            share = (replay_lsn - self._lsns[k - 1]) / (self._lsns[k] - self._lsns[k - 1])
            value = now - (self._last[k - 1] + share * (self._first[k] - self._last[k - 1]))
            evidence = "interpolated"
        elif (commit_estimate is not None and last_commit is not None and later_commit is not None
              and self._last[k - 1] < last_commit < self._first[k]):
            # Writes began somewhere in the bracket, but the replica has replayed a commit
            # made inside it and the primary has committed again since (another replica
            # has that later commit): what it misses followed that commit.
            value, evidence = commit_estimate, "commit_timestamp"
        else:
            value, evidence = lower, lower_evidence
        if commit_estimate is not None and commit_estimate < value:
            value, evidence = commit_estimate, "commit_timestamp"
        if value <= lower:
            return Staleness(lower, lower_evidence)
        return Staleness(min(value, upper), evidence)

    def _past_the_end(self, now: float, later_commit: float | None) -> Staleness:
        """A replica past all the primary was seen to write: caught up, unless it lacks a
        commit another replica has replayed (the primary wrote since its last poll, late on
        a busy host): then it is at least that commit's age behind, and at most the time
        since the primary was last seen short of it."""
        if later_commit is None or now <= later_commit:
            return Staleness(0.0, "caught_up")
        return Staleness(max(0.0, now - max(later_commit, self._last[-1])), "commit_timestamp")

    def _interpolable(self, k: int, last_commit_at: float | None) -> bool:
        """Whether the bytes between points k-1 and k may be spread evenly over the time
        between them: only inside a stream. The primary was writing at the poll before
        (the bracket does not start at a burst's edge); it wrote at about the same rate
        in the bracket before (not the last of a burst followed by one stray record, as a
        checkpoint or autovacuum leaves, nor a sudden surge); and the replica has lately
        replayed a commit from around there."""
        if not (self._steady[k] and k >= 2 and last_commit_at is not None and last_commit_at > self._last[k - 2]):
            return False
        rate = _rate(self._lsns[k] - self._lsns[k - 1], self._first[k] - self._last[k - 1])
        before = _rate(self._lsns[k - 1] - self._lsns[k - 2], self._first[k - 1] - self._last[k - 2])
        return rate is not None and before is not None and before / _STEADY_RATIO <= rate <= before * _STEADY_RATIO


# The clock's first thinning: until then every poll's point is kept (at 1 s, ~4 minutes).
_THIN_FIRST_AT = 256

# How much the WAL rate may change from one bracket to the next for both to count as one
# stream. Poll-to-poll noise of a steady load is well inside this (±25% with 20 commits a
# bracket); an edge is far outside.
_STEADY_RATIO = 2.0


def _rate(nbytes: int, seconds: float) -> float | None:
    return nbytes / seconds if seconds > 0 else None


def _kept_points(lsns: Sequence[int], first: Sequence[float], last: Sequence[float], resolution: float,
                 now: float) -> list[int]:
    """Indexes of the points worth keeping. Dropping point i makes replay LSNs in
    (lsn[i-1], lsn[i]] date from the next kept point instead: under-read by at most that
    point's first time minus last[i-1]. A point goes only when that gap is within
    ``resolution`` of the staleness such a replica would read. The first and the last
    point always stay."""
    if len(lsns) < 3:
        return list(range(len(lsns)))
    kept = [len(lsns) - 1]  # built newest to oldest
    for i in range(len(lsns) - 2, 0, -1):
        following = first[kept[-1]]
        if following - last[i - 1] <= resolution * (now - following):
            continue
        kept.append(i)
    kept.append(0)
    return kept[::-1]
