"""The dating rule (estimate/dating.py) by a table, and by a property over simulated
timelines: a reading never goes above a proven upper bound nor below a proven lower one."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lagwatch.estimate.dating import Dated, Known, Stands, date, gather
from lagwatch.estimate.lsnclock import Commits, LsnClock, WalDates

AT = 10.0


def known(**values: object) -> Known:
    return Known(at=AT, seen=True, **values)


# Each row: the situation, what is known at AT = 10.0, whether an earlier reading could
# stand, and the reading (seconds, the estimate that dated it, the bound that moved it).
TABLE: list[tuple[str, Known, bool, Dated | Stands | None]] = [
    ("the primary not yet seen, no WAL read", Known(at=AT, seen=False), False, None),
    ("the WAL's first commit past it dates it",
     known(short_of=9.0, first_past=9.5, wal_dated=0.4), False, Dated(0.4, "wal_commit")),
    ("that commit was stamped before the primary was last seen short of the position: "
     "it became visible after, and the clock holds it",
     known(short_of=9.8, first_past=9.9, wal_dated=0.4), False, Dated(0.2, "wal_commit", "short_of")),
    ("the WAL read (a cycle old) saw nothing past it, but it lacks a later commit another "
     "replica has replayed", known(short_of=9.8, wal_dated=0.0, later_commit=9.9), False,
     Dated(0.1, "wal_commit", "later_commit")),
    ("past all the primary was seen to write", known(short_of=9.9), False, Dated(0.0, "caught_up")),
    ("past the clock's end, lacking a later commit",
     known(short_of=9.9, later_commit=9.95), False, Dated(0.05, "caught_up", "later_commit")),
    ("... whose stamp is older than the primary's last sight short of it: the upper bound wins",
     known(short_of=9.97, later_commit=9.95), False, Dated(0.03, "caught_up", "short_of")),
    ("behind lagwatch's history", known(first_past=5.0), False, Dated(5.0, "history_start")),
    ("behind the history, the walsender's replay_lag more", known(first_past=5.0, walsender_lag=7.0), False,
     Dated(7.0, "walsender")),
    ("... but no older than its last replayed commit", known(first_past=5.0, walsender_lag=7.0, last_replayed=4.0),
     False, Dated(6.0, "walsender", "replayed_commit")),
    ("inside a steady stream, by bytes", known(short_of=8.0, first_past=9.0, interpolated=8.5), False,
     Dated(1.5, "interpolated")),
    ("the last replayed commit, less the commit interval, says less",
     known(short_of=8.0, first_past=9.0, interpolated=8.5, last_replayed=8.7, commit_interval=0.1), False,
     Dated(1.2, "commit_timestamp")),
    ("writes began inside the bracket; it replayed a commit made there and another replica a later one",
     known(short_of=8.0, first_past=9.0, last_replayed=8.5, later_commit=9.5), False,
     Dated(1.5, "commit_timestamp")),
    ("nothing finer: the bracket's lower end", known(short_of=8.0, first_past=9.0), False, Dated(1.0, "lsn_clock")),
    ("a big transaction's bytes are older than the commit it lacks: its last replayed commit caps it",
     known(short_of=8.0, first_past=9.0, last_replayed=9.5), False, Dated(0.5, "lsn_clock", "replayed_commit")),
    ("the WAL read lists a commit short of it it has replayed", known(short_of=8.0, first_past=9.0, wal_cap=0.3),
     False, Dated(0.3, "lsn_clock", "wal_read")),
    ("the heartbeat it shows caps it", known(short_of=8.0, first_past=9.0, heartbeat=(0.1, 0.2)), False,
     Dated(0.2, "lsn_clock", "heartbeat_upper")),
    ("the beat it lacks floors it", known(short_of=8.0, first_past=9.0, heartbeat=(1.5, None)), False,
     Dated(1.5, "lsn_clock", "heartbeat_lower")),
    ("two bounds disagree (instants put on lagwatch's clock by different reads): the upper wins",
     known(short_of=8.5, first_past=9.0, later_commit=8.2), False, Dated(1.5, "lsn_clock", "short_of")),
    ("the primary seen last over an interval before the replica answered, and it is past that: "
     "its last reading stands", known(short_of=9.0, primary_late=True), True, Stands()),
    ("... with no earlier reading, the one it gives is taken", known(short_of=9.0, primary_late=True), False,
     Dated(0.0, "caught_up")),
    ("... a commit the WAL found past it still dates it",
     known(short_of=9.0, wal_dated=0.4, primary_late=True), True, Dated(0.4, "wal_commit")),
    ("... the WAL's 0 as of its read does not", known(short_of=9.0, wal_dated=0.0, primary_late=True), True,
     Stands()),
    ("... the heartbeat's bounds, within an interval of each other, still hold it",
     known(short_of=9.0, heartbeat=(0.3, 0.5), primary_late=True, interval=0.2), True,
     Dated(0.3, "caught_up", "heartbeat_lower")),
    ("... beats further apart than an interval (the writer's commits stalled) do not",
     known(short_of=9.0, heartbeat=(0.3, 0.55), primary_late=True, interval=0.2), True, Stands()),
    ("... beats exactly an interval apart still do",
     known(short_of=9.0, heartbeat=(0.3, 0.5), primary_late=True, interval=0.2), True,
     Dated(0.3, "caught_up", "heartbeat_lower")),
    ("... the WAL's 0 raised by wide beats' floor does not hold it either",
     known(short_of=9.0, wal_dated=0.0, heartbeat=(0.3, 0.55), primary_late=True, interval=0.2), True, Stands()),
    ("... the WAL's 0 held by close beats does",
     known(short_of=9.0, wal_dated=0.0, heartbeat=(0.3, 0.4), primary_late=True, interval=0.2), True,
     Dated(0.3, "wal_commit", "heartbeat_lower")),
    ("... nor a beat older than the log (no upper bound)",
     known(short_of=9.0, heartbeat=(0.3, None), primary_late=True, interval=0.2), True, Stands()),
    ("... with no earlier reading, the wide beats' floor is taken",
     known(short_of=9.0, heartbeat=(0.3, 0.55), primary_late=True, interval=0.2), False,
     Dated(0.3, "caught_up", "heartbeat_lower")),
]


@pytest.mark.parametrize(("situation", "facts", "standing", "expected"), TABLE, ids=[row[0][:60] for row in TABLE])
def test_the_dating_rule(situation: str, facts: Known, standing: bool, expected: Dated | Stands | None) -> None:
    assert _shape(date(facts, standing)) == _shape(expected), situation


def _shape(reading: Dated | Stands | None) -> object:
    """A reading to the nanosecond (the table's sums are decimal, the rule's binary)."""
    return (round(reading.seconds, 9), reading.evidence, reading.bound) if isinstance(reading, Dated) else reading


# -- the property: a simulated primary and replica --------------------------------------


@dataclass(frozen=True)
class Timeline:
    """A primary's WAL as it was written: each event (a transaction's data, or a commit
    record) at its time, in WAL order; a commit is stamped as its record is written, so
    stamps follow the WAL's order (the microseconds a record can land after its stamp
    are left out: there, no bound is exact either)."""

    times: tuple[float, ...]
    ends: tuple[int, ...]  # each event's end LSN
    commits: tuple[int, ...]  # the indexes of the commit records

    def position(self, t: float) -> int:
        """The primary's insert position at ``t``."""
        k = bisect.bisect_right(self.times, t)
        return self.ends[k - 1] if k else 0

    def start(self, i: int) -> int:
        return self.ends[i - 1] if i else 0

    def commits_in(self, lo: int, hi: int) -> list[tuple[int, float]]:
        """(start LSN, time) of the commit records starting in [lo, hi)."""
        return [(self.start(i), self.times[i]) for i in self.commits if lo <= self.start(i) < hi]


@st.composite
def situations(draw: st.DrawFn) -> tuple[LsnClock, int, float, dict[str, object], dict[str, float | None]]:
    """The LSN clock lagwatch's polls made of a simulated primary, a replica's replay
    position, the instant it is read at, what else is known of it, and the proven bounds
    (by name) that knowledge holds, with the truth."""
    n = draw(st.integers(2, 30))
    gaps = draw(st.lists(st.floats(0.001, 1.0), min_size=n, max_size=n))
    sizes = draw(st.lists(st.integers(1, 5000), min_size=n, max_size=n))
    is_commit = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    times, ends, t, end = [], [], 0.0, 0
    for gap, size in zip(gaps, sizes, strict=True):
        t, end = t + gap, end + size
        times.append(t)
        ends.append(end)
    at = times[-1] + draw(st.floats(0.0, 2.0))
    line = Timeline(tuple(times), tuple(ends), tuple(i for i, c in enumerate(is_commit) if c))
    # lagwatch's polls of the primary, one after another on one session: each asked at some
    # instant and answered up to 50 ms later, the position read at a moment in between.
    clock = LsnClock(1024)
    answered = 0.0
    for p in sorted(draw(st.lists(st.floats(0.0, at), min_size=1, max_size=40))):
        asked = max(p, answered)
        trip = draw(st.floats(0.0, 0.05))
        if asked + trip > at:  # every poll that dates the reading was answered by its instant
            break
        answered = asked + trip
        clock.record(line.position(asked + draw(st.floats(0.0, 1.0)) * trip), now=answered, asked=asked)
    # The replica has replayed the first ``done`` events; another replica perhaps more.
    done = draw(st.integers(0, n))
    replay = line.start(done)
    replayed = [line.times[i] for i in line.commits if i < done]
    lacking = [line.times[i] for i in line.commits if i >= done]
    other = draw(st.integers(done, n))
    newest = max([line.times[i] for i in line.commits if i < other], default=None)
    last_replayed = replayed[-1] if replayed else None
    commits = Commits(last_replayed, newest, draw(st.floats(0.0, 1.0)))
    facts: dict[str, object] = {"commits": commits, "walsender_lag": draw(st.floats(0.0, 20.0))}
    # The WAL read: from where the replica (or its walsender) was, as far as the budget
    # went, when it was read (at or before AT).
    if draw(st.booleans()):
        read_at = draw(st.floats(0.0, at))
        flushed = line.position(read_at)
        start = min(replay, flushed, draw(st.sampled_from([0, *line.ends])))
        stop = min(flushed, max(start, draw(st.sampled_from([*line.ends, flushed]))))
        facts["wal"] = WalDates(start, stop, tuple(line.commits_in(start, stop)), complete=stop == flushed)
    # The heartbeat: a few of the commits are beats.
    beats = draw(st.lists(st.sampled_from(line.commits), max_size=5)) if line.commits else []
    shown = [line.times[i] for i in beats if i < done]
    missing = [line.times[i] for i in beats if i >= done]
    if shown or missing:
        facts["heartbeat"] = (at - min(missing) if missing else 0.0, at - max(shown) if shown else None)
    # The bounds that knowledge proves, from the timeline's own truth.
    short_of = clock.last_short_of(replay)
    bounds: dict[str, float | None] = {
        "short_of": None if short_of is None else at - short_of,
        "replayed_commit": None if last_replayed is None else at - last_replayed,
        "later_commit": at - newest if commits.lacks_newer and newest is not None else None,
        "heartbeat_lower": facts["heartbeat"][0] if "heartbeat" in facts else None,  # type: ignore[index]
        "heartbeat_upper": facts["heartbeat"][1] if "heartbeat" in facts else None,  # type: ignore[index]
        "truth": at - lacking[0] if lacking else 0.0,
    }
    return clock, replay, at, facts, bounds


@settings(max_examples=500, deadline=None)
@given(situations(), st.booleans())
def test_a_reading_stays_within_every_proven_bound(
        situation: tuple[LsnClock, int, float, dict[str, object], dict[str, float | None]], standing: bool) -> None:
    clock, replay, at, facts, bounds = situation
    known_now = gather(clock, replay, at, interval=0.1, **facts)
    reading = date(known_now, standing)
    uppers = [v for k, v in bounds.items() if k in ("short_of", "replayed_commit", "heartbeat_upper") and v is not None]
    if known_now.wal_cap is not None:
        uppers.append(known_now.wal_cap)
    lowers = [v for k, v in bounds.items() if k in ("later_commit", "heartbeat_lower") and v is not None]
    truth = bounds["truth"]
    assert truth is not None
    # The simulation is consistent, as a real server's evidence is: the truth is inside.
    assert all(truth <= u + 1e-9 for u in uppers) and all(truth >= low - 1e-9 for low in lowers), (truth, bounds)
    if isinstance(reading, Dated):
        assert reading.seconds >= 0.0
        assert all(reading.seconds <= u + 1e-9 for u in uppers), (reading, bounds, known_now)
        assert all(reading.seconds >= low - 1e-9 for low in lowers), (reading, bounds, known_now)
    else:
        assert reading is None or (standing and known_now.primary_late)
