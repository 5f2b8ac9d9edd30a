"""The dating rule: how old the oldest change is that a replica (or a logical consumer) has
not replayed, from every piece of evidence lagwatch holds about it, in one pure function.

``gather`` collects the evidence for one position at one instant (``at``, lagwatch's
monotonic clock); ``date`` reads it. Nothing else reads the LSN clock's history to date a
reading. The evidence, in the order an estimate is chosen (the first that applies):

  estimate          what it is
  wal_commit        the first commit in the primary's WAL past the position: its age
                    (lsnclock.date_from_wal); 0 when the read reached the primary's flush and
                    found none. Exact, to the primary clock's offset.
  caught_up         past all the primary was seen to write: 0.
  walsender /       behind lagwatch's history (it began after the primary passed the
  history_start     position): the walsender's replay_lag where that is more, else the
                    time since the history began. Both lower than the truth.
  interpolated      inside a steady stream, the LSN bracket by bytes (LsnClock.bracket).
  commit_timestamp  the last commit it replayed, less the primary's time between commits:
                    where that is less than the others, or where the replica replayed a
                    commit made inside the bracket and another replica has a later one.
  lsn_clock         the bracket's lower end: the primary first seen past the position (it
                    dates bytes: a transaction not yet committed reads as old as its first).

The clock's estimates never go below ``lsn_clock``. Then the proven bounds hold it, once:
raised to the highest lower bound, then lowered to the lowest upper bound, so that where
two bounds disagree (their instants put on lagwatch's clock by different reads) the upper
one wins: an over-read ejects a healthy replica, an under-read does not.

  bound             side   why it holds
  later_commit      lower  another replica has replayed a commit this one lacks: what it
                           lacks is at least that old
  heartbeat_lower   lower  it lacks the beat after the last it shows (beats.py)
  short_of          upper  the primary was last seen short of the position (LsnClock.
                           last_short_of): what it lacks was written after
  replayed_commit   upper  what it lacks was committed after the last commit it replayed
  wal_read          upper  the WAL read lists commits short of the position it has replayed,
                           or found none past it up to where it read, which the primary was
                           last seen short of
  heartbeat_upper   upper  it has the beat it shows: what it lacks was made after it

A reading names its estimate (``evidence``, the ``lag_evidence`` label) and the bound that
moved it, if one did (``bound``).

A reading may also not be made (``Stands``): when the replica is past where the primary was
last seen, more than an interval before the replica answered (the primary's poll late on a
busy host, its answer taken a cycle late), all it says is "past a stale position": 0, or a
floor, would be a guess from lagwatch's own lateness. The replica's last reading stands and
the window takes nothing, unless the WAL found a commit past it or the heartbeat holds it:
its bounds moved the reading and lie no further apart than an interval (what an on-time
poll of the primary would bracket). Beats further apart than that (the writer's commits
waiting behind a big transaction's WAL flush, or lagwatch late to send them) prove as
little as the stale position: their lower bound read 65 ms where the oracle proved 171 ms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lagwatch.estimate.lsnclock import Commits, Evidence, LsnClock, WalDates, date_from_wal, visible_commits
from lagwatch.fastinit import fast_init

Bound = Literal["later_commit", "heartbeat_lower", "short_of", "replayed_commit", "wal_read", "heartbeat_upper"]


@fast_init
@dataclass(frozen=True)
class Known:
    """Everything known of one position at one instant, as named values on lagwatch's
    monotonic clock (seconds). None: not known."""

    at: float
    seen: bool  # the primary has been seen at all (an empty LSN clock dates nothing)
    short_of: float | None = None  # the last time the primary was seen at or short of the position
    first_past: float | None = None  # the first time it was seen past it (None: not yet seen past it)
    interpolated: float | None = None  # when the first byte past it was written, by bytes (a stream only)
    last_replayed: float | None = None  # the last commit it replayed
    later_commit: float | None = None  # a later commit another replica has replayed, which it lacks
    commit_interval: float = 0.0  # the primary's mean time between transactions lately (0: unknown)
    wal_dated: float | None = None  # the staleness the WAL dates it at (lsnclock.date_from_wal)
    wal_cap: float | None = None  # what the WAL read proves of it from above, when it does not date it
    walsender_lag: float | None = None  # the walsender's replay_lag (only behind the history)
    heartbeat: tuple[float, float | None] | None = None  # (lower, upper) the beats give (beats.Beats.bounds)
    primary_late: bool = False  # past where the primary was seen, over an interval before it answered
    interval: float | None = None  # the poll interval lateness is judged by (None: not asked)


@fast_init
@dataclass(frozen=True)
class Dated:
    seconds: float
    evidence: Evidence
    bound: Bound | None = None  # the bound that moved the estimate, if one did


@fast_init
@dataclass(frozen=True)
class Stands:
    """No new reading: the replica's last one stands (see the module docstring)."""


def date(known: Known, standing: bool) -> Dated | Stands | None:
    """The reading ``known`` gives; ``standing``: the replica has an earlier reading that
    could stand. None when nothing dates it (the primary not yet seen, no WAL read)."""
    estimate = _estimate(known)
    if estimate is None:
        return None
    seconds, evidence = estimate
    bound: Bound | None = None
    lower = max(_lower_bounds(known), default=None)
    if lower is not None and seconds < lower[0]:
        seconds, bound = lower
    upper = min(_upper_bounds(known), default=None)
    if upper is not None and seconds > upper[0]:
        seconds, bound = upper
    seconds = max(0.0, seconds)
    # The WAL's own date, not the reading a bound made of it: a read that found no commit
    # past the position (0) says nothing new of it, whatever a lower bound raised it to.
    held = (bound in ("heartbeat_lower", "heartbeat_upper") and _beats_close(known)) or (
        known.wal_dated is not None and known.wal_dated > 0)
    if known.primary_late and standing and not held:
        return Stands()
    return Dated(seconds, evidence, bound)


def _beats_close(k: Known) -> bool:
    """Whether the heartbeat brackets the reading within an interval (see the docstring)."""
    if k.heartbeat is None or k.heartbeat[1] is None or k.interval is None:
        return False
    return k.heartbeat[1] - k.heartbeat[0] <= k.interval


def _estimate(k: Known) -> tuple[float, Evidence] | None:
    if k.wal_dated is not None:
        return k.wal_dated, "wal_commit"
    if not k.seen:
        return None
    if k.first_past is None:
        return 0.0, "caught_up"
    floor = max(0.0, k.at - k.first_past)
    if k.short_of is None:
        if k.walsender_lag is not None and k.walsender_lag > floor:
            return k.walsender_lag, "walsender"
        return floor, "history_start"
    commit_estimate = None if k.last_replayed is None else k.at - k.last_replayed - k.commit_interval
    value: float
    evidence: Evidence
    if k.interpolated is not None:
        value, evidence = k.at - k.interpolated, "interpolated"
    elif (commit_estimate is not None and k.later_commit is not None and k.last_replayed is not None
          and k.short_of < k.last_replayed < k.first_past):
        # Writes began somewhere in the bracket, but the replica has replayed a commit made
        # inside it and the primary has committed again since: what it lacks followed that.
        value, evidence = commit_estimate, "commit_timestamp"
    else:
        value, evidence = floor, "lsn_clock"
    if commit_estimate is not None and commit_estimate < value:
        # High by the wait for the next change, about one commit interval in a stream (the
        # mean over all the primary's transactions is no longer than between the writing
        # ones, so taking it off does not go below the truth there).
        value, evidence = commit_estimate, "commit_timestamp"
    return (floor, "lsn_clock") if value <= floor else (value, evidence)


def _lower_bounds(k: Known) -> list[tuple[float, Bound]]:
    bounds: list[tuple[float, Bound]] = []
    if k.later_commit is not None:
        bounds.append((k.at - k.later_commit, "later_commit"))
    if k.heartbeat is not None:
        bounds.append((k.heartbeat[0], "heartbeat_lower"))
    return bounds


def _upper_bounds(k: Known) -> list[tuple[float, Bound]]:
    bounds: list[tuple[float, Bound]] = []
    if k.short_of is not None:
        bounds.append((k.at - k.short_of, "short_of"))
    if k.last_replayed is not None:
        bounds.append((k.at - k.last_replayed, "replayed_commit"))
    if k.wal_cap is not None:
        bounds.append((k.wal_cap, "wal_read"))
    if k.heartbeat is not None and k.heartbeat[1] is not None:
        bounds.append((k.heartbeat[1], "heartbeat_upper"))
    return bounds


def gather(clock: LsnClock, lsn: int, at: float, *, commits: Commits | None = None, wal: WalDates | None = None,
           walsender_lag: float | None = None, heartbeat: tuple[float, float | None] | None = None,
           interval: float | None = None) -> Known:
    """What is known of a replica (or a consumer) that had replayed up to ``lsn`` at ``at``.

    ``commits``: what commit timestamps say, and ``wal``: the primary's WAL read past its
    position, both put on lagwatch's clock by the one converter (estimate/clock.py);
    ``walsender_lag``: the walsender's replay_lag; ``heartbeat``: the beats' bounds;
    ``interval``: the poll interval, for the primary's lateness (None: not asked)."""
    commits = commits or Commits()
    wal_dated = None
    if wal is not None:
        dated = date_from_wal(lsn, at, wal, commits.last_replayed)
        wal_dated = dated.seconds if dated is not None else None
    bracket = clock.bracket(lsn, commits.last_replayed)
    latest = clock.latest_lsn
    late = False
    if interval is not None and latest is not None and lsn >= latest:
        seen = clock.last_short_of(latest)
        late = seen is not None and at - seen > interval
    return Known(
        at=at, seen=latest is not None, short_of=bracket.short_of, first_past=bracket.first_past,
        interpolated=bracket.interpolated,
        last_replayed=commits.last_replayed,
        later_commit=commits.newest_seen if commits.lacks_newer else None, commit_interval=commits.interval,
        wal_dated=wal_dated, wal_cap=None if wal_dated is not None or wal is None else _wal_cap(clock, lsn, at, wal),
        walsender_lag=walsender_lag if bracket.short_of is None else None, heartbeat=heartbeat, primary_late=late,
        interval=interval)


def _wal_cap(clock: LsnClock, lsn: int, at: float, wal: WalDates) -> float | None:
    """What a WAL read that does not date the position proves of it: the commits it lists
    short of the position were replayed, so what it lacks was made after the last of them;
    and with no commit listed past it, the first it lacks lies beyond what was read,
    written after the primary was last seen short of there."""
    if lsn < wal.start:
        return None
    caps = [at - visible for commit_lsn, visible in visible_commits(wal.commits) if commit_lsn < lsn][-1:]
    if lsn < wal.end:
        seen = clock.last_short_of(wal.end)
        if seen is not None:
            caps.append(at - seen)
    return max(0.0, min(caps)) if caps else None
