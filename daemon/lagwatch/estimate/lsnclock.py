"""Staleness without trusting clocks: the LSN clock, and what the primary's WAL and commit
timestamps say of one position (their windows and histograms: windows.py; the one rule
that weighs all of it into a reading: estimate/dating.py).

Each cycle records (primary's current LSN, our monotonic time) on the LSN clock. A
replica's staleness is the age of the oldest change it has not replayed: ``now - W`` where
W is when the primary wrote the first change past the replica's replay LSN. It is 0 when
the replica has replayed everything the primary had, whatever the primary's commit
timestamps or the hosts' clocks say, so it stays 0 on an idle primary and keeps growing
while replay is stalled.

The clock brackets W between two polls (``LsnClock.bracket``): the primary was last seen
short of the byte at one poll (``last_short_of``, the one place that answers that) and
first seen past it at the next; inside a steady stream of writes the bytes date W between
the two. Commit timestamps (``Commits``, on the primary's own clock) bound it; where
lagwatch may read the primary's WAL (pg_walinspect), the first commit record past a
replica's replay position dates it (``date_from_wal``), however bursty the load or big the
transaction. A change is what a reader can see: the records of a transaction still
running, or of one rolled back, are not missing from the replica's answers until their
commit is. Everything here is pure: time comes in as an argument.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from lagwatch.fastinit import fast_init

# Which estimate dated a reading (the ``lag_evidence`` label; the bound that held it, if
# one did, is named beside it: estimate/dating.py):
#   caught_up         the replica has replayed everything the primary was seen to write: 0
#   interpolated      by bytes between the two polls that bracket the first unreplayed byte
#   commit_timestamp  from commit timestamps: the last one the replica replayed, a later one it lacks
#   lsn_clock         the bracket's lower end: nothing finer is known (a burst just began)
#   history_start     behind lagwatch's history: time since the history began, a lower bound
#   walsender         behind lagwatch's history: the walsender's replay_lag, a better floor
#   wal_commit        from the WAL itself: the time of the first commit past the replay position
Evidence = Literal["caught_up", "interpolated", "commit_timestamp", "lsn_clock", "history_start", "walsender",
                   "wal_commit"]


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
    monotonic clock (commitscan.py reads it as views.walcommits.WalCommits, on the primary's
    clock; estimate/clock.PrimaryClock.dated puts it here): every commit in [start, end)."""

    start: int
    end: int
    commits: tuple[tuple[int, float], ...]  # (start LSN of the commit record, monotonic time it was made)
    # Read up to where the primary had flushed when it was read: no commit past the last
    # listed had been made by then.
    complete: bool


@fast_init
@dataclass(frozen=True)
class Bracket:
    """Where the LSN clock puts the first byte past a position (monotonic seconds)."""

    short_of: float | None  # the last time the primary was seen at or short of it (None: before the history)
    first_past: float | None  # the first time it was seen past it (None: not seen past it yet)
    interpolated: float | None = None  # by bytes, inside a steady stream (None: not interpolable)


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

    def bracket(self, lsn: int, last_commit: float | None = None) -> Bracket:
        """When the primary wrote the first byte past ``lsn``, as the clock knows it: after
        it was last seen short of it, by the time it was first seen past it, and, inside a
        steady stream where the replica has lately replayed a commit (``last_commit``, its
        time), where the bytes put it in between."""
        k = bisect.bisect_right(self._lsns, lsn)
        short_of = self.last_short_of(lsn)
        if k == len(self._lsns):
            return Bracket(short_of, None)
        first_past = self._first[k]
        if short_of is None or not self._interpolable(k, last_commit):
            return Bracket(short_of, first_past)
        share = (lsn - self._lsns[k - 1]) / (self._lsns[k] - self._lsns[k - 1])
        return Bracket(short_of, first_past, short_of + share * (first_past - short_of))

    def age(self, lsn: int, now: float) -> float | None:
        """The bracket's lower end at ``now``: how long since the primary was first seen past
        ``lsn`` (0 if it has not been; since the history began if it was before). None before
        the primary has been seen at all. Dates a position on the clock alone (a stage's
        boundary, a held transaction ID), where no commit says more."""
        if not self._lsns:
            return None
        first_past = self.bracket(lsn).first_past
        return 0.0 if first_past is None else max(0.0, now - first_past)

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
