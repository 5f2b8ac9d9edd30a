"""Window math, LSN clock and histogram, with a fake clock."""

from __future__ import annotations

import math
from array import array

import pytest
from lagwatch.estimate.dating import Dated, date, gather
from lagwatch.estimate.lsnclock import Commits, LsnClock, Staleness
from lagwatch.estimate.windows import LAG_BUCKETS, LagHistogram, LagSamples, LagWindow, nearest_rank


def estimate(clock: LsnClock, replay_lsn: int, now: float, commits: Commits | None = None) -> Staleness | None:
    """What the dating rule (estimate/dating.py) reads from the clock and commit timestamps."""
    dated = date(gather(clock, replay_lsn, now, commits=commits), standing=False)
    return None if dated is None else Staleness(dated.seconds, dated.evidence)  # type: ignore[union-attr]


def dated(clock: LsnClock, replay_lsn: int, now: float, commits: Commits | None = None) -> Dated:
    """The whole reading: its estimate and the bound that moved it, if one did."""
    reading = date(gather(clock, replay_lsn, now, commits=commits), standing=False)
    assert isinstance(reading, Dated)
    return reading


def seconds(clock: LsnClock, replay_lsn: int, now: float, last_commit_at: float | None = None) -> float:
    reading = estimate(clock, replay_lsn, now, Commits(last_commit_at))
    assert reading is not None
    return reading.seconds


def test_clock_is_zero_when_replica_has_replayed_everything() -> None:
    clock = LsnClock(100)
    clock.record(1000, now=10.0)
    assert estimate(clock, 1000, now=70.0) == Staleness(0.0, "caught_up")
    assert seconds(clock, 1500, now=70.0) == 0.0


def test_past_all_the_primary_was_seen_to_write_but_lacking_a_commit_another_replayed() -> None:
    """The primary's poll late (a busy host): the clock ends a cycle back, and a replica past
    its end would read caught up. Another replica has replayed a commit made at 10.05 that
    this one lacks: it is at least that commit's age behind, never more than the time since
    the primary was last seen short of it (a stamp older than that is held there)."""
    clock = LsnClock(100)
    clock.record(1000, now=10.0)
    assert dated(clock, 1200, now=10.15, commits=Commits(9.99, newest_seen=10.05)) == \
        Dated(pytest.approx(0.10), "caught_up", "later_commit")  # type: ignore[arg-type]
    assert dated(clock, 1200, now=10.15, commits=Commits(9.9, newest_seen=9.95)) == \
        Dated(pytest.approx(0.15), "caught_up", "short_of")  # type: ignore[arg-type]
    # Nothing newer anywhere (or newer than the reading's instant): caught up.
    assert estimate(clock, 1200, now=10.15, commits=Commits(10.05, newest_seen=10.05)) == Staleness(0.0, "caught_up")
    assert estimate(clock, 1200, now=10.15, commits=Commits(9.9, newest_seen=10.2)) == Staleness(0.0, "caught_up")


def test_steady_writes_are_interpolated_between_polls() -> None:
    """A steady stream: 100 bytes a second, polled every second. The first unreplayed
    byte was written at a time the polls only bracket; bytes say where in between."""
    clock = LsnClock(100)
    for t in range(4):
        clock.record(1000 + 100 * t, now=10.0 + t)
    # Byte 1150 was written at t=11.5 (between the polls at 11 and 12); the replica's last
    # replayed commit (11.49) says writes were flowing there.
    reading = estimate(clock, 1150, now=12.5, commits=Commits(11.49))
    assert reading is not None and reading.evidence == "interpolated"
    assert reading.seconds == pytest.approx(1.0)
    # 60 ms behind a steady stream reads 60 ms, not 0 (what the poll alone would say).
    assert seconds(clock, 1294, now=13.0, last_commit_at=12.93) == pytest.approx(0.06)


def test_a_stray_record_after_quiet_is_not_a_stream() -> None:
    """Writes stop; one checkpoint record arrives just before a poll, and the replica is
    polled a moment before it replays it. Spreading that record over the second before
    would read ~1 s; nothing the replica replayed lately says writes were flowing."""
    clock = LsnClock(100)
    for t in range(5):
        clock.record(1000 + 100 * t, now=float(t))
    clock.record(1410, now=5.0)  # a stray record after the last writes
    # The replica has replayed all the writes (its last commit at 3.9), not the record.
    assert estimate(clock, 1400, now=5.001, commits=Commits(3.9)) == Staleness(pytest.approx(0.001), "lsn_clock")  # type: ignore[arg-type]
    assert seconds(clock, 1400, now=5.001) == pytest.approx(0.001)


def test_never_outside_the_bracket_of_two_polls() -> None:
    clock = LsnClock(100)
    for t, lsn in enumerate((1000, 1100, 1200, 1300, 5000)):
        clock.record(lsn, now=float(t))
    # Byte 1250: the primary was short of it at t=2 and past it at t=3; bytes say 2.5,
    # and the replica replayed a commit at 2.1, so writes were flowing there.
    assert estimate(clock, 1250, now=4.0, commits=Commits(2.1)) == Staleness(pytest.approx(1.5), "interpolated")  # type: ignore[arg-type]
    # The last commit the replica replayed was at 2.7: what it lacks came after that.
    assert estimate(clock, 1250, now=4.0, commits=Commits(2.7)) == Staleness(pytest.approx(1.3), "commit_timestamp")  # type: ignore[arg-type]
    # A commit bound below the bracket's lower end: the bracket dates bytes, and a big
    # transaction writes its bytes long before the commit that makes them visible; what
    # the replica lacks became visible after its last replayed commit (proven): that wins.
    assert dated(clock, 1250, now=4.0, commits=Commits(3.5)) == \
        Dated(pytest.approx(0.5), "lsn_clock", "replayed_commit")  # type: ignore[arg-type]


def test_a_burst_after_idle_polls_is_not_interpolated() -> None:
    """Idle at polls 0..5, then 1000 bytes by poll 6. The writes may have started just
    before 6: interpolating from 5 would over-read (an ejected healthy replica)."""
    clock = LsnClock(100)
    for t in range(6):
        clock.record(1000, now=float(t))
    clock.record(2000, now=6.0)
    reading = estimate(clock, 1500, now=6.05)
    assert reading == Staleness(pytest.approx(0.05), "lsn_clock")  # type: ignore[arg-type]
    # Once the replica has replayed a commit made inside the bracket, the change it still
    # lacks came after that commit.
    reading = estimate(clock, 1500, now=6.05, commits=Commits(5.95, newest_seen=6.04))
    assert reading == Staleness(pytest.approx(0.1), "commit_timestamp")  # type: ignore[arg-type]
    # ... but only if the primary has committed since (another replica has a later
    # commit): else the writes may have ended with that commit, and what the replica
    # lacks (a stray record) was written any time after.
    reading = estimate(clock, 1500, now=6.05, commits=Commits(5.95, newest_seen=5.95))
    assert reading == Staleness(pytest.approx(0.05), "lsn_clock")  # type: ignore[arg-type]
    # A commit from before the bracket says nothing finer.
    assert estimate(clock, 1500, now=6.05, commits=Commits(1.0)) == Staleness(pytest.approx(0.05), "lsn_clock")  # type: ignore[arg-type]


def test_the_end_of_a_burst_then_a_stray_record_is_not_dated_by_the_commit() -> None:
    """Idle, then a burst inside one bracket that ends early; a stray record comes just
    before the poll. The replica has replayed the whole burst: what it lacks is the stray
    record, written any time after the burst's last commit."""
    clock = LsnClock(100)
    for t in range(6):
        clock.record(1000, now=float(t))
    clock.record(2000, now=6.0)
    reading = estimate(clock, 1990, now=6.001, commits=Commits(5.3, newest_seen=5.3))
    assert reading == Staleness(pytest.approx(0.001), "lsn_clock")  # type: ignore[arg-type]


def test_the_commit_bound_is_high_by_about_one_commit_interval() -> None:
    clock = LsnClock(100)
    for t in range(6):
        clock.record(1000, now=float(t))
    clock.record(2000, now=6.0)
    # Writes since 5.5 at 1000 bytes/s; the replica's last commit was at 5.9, and the
    # primary commits every 10 ms: the change it lacks came ~10 ms after that commit.
    reading = estimate(clock, 1400, now=6.05, commits=Commits(5.9, newest_seen=6.04, interval=0.01))
    assert reading == Staleness(pytest.approx(0.14), "commit_timestamp")  # type: ignore[arg-type]
    # Never below the bracket's lower end, whatever the interval.
    assert estimate(clock, 1400, now=6.05, commits=Commits(5.9, newest_seen=6.04, interval=5.0)) == Staleness(
        pytest.approx(0.05), "lsn_clock")  # type: ignore[arg-type]


def test_sparse_commits_read_the_one_the_replica_lacks() -> None:
    """Commits 80 ms apart, polled every second: bytes say nothing about when within the
    second each was written. replica2 has replayed the newest commit (at 5.99); replica1,
    30 ms behind, has the one before (at 5.91) but not that one: it reads its age, 10 ms,
    not the ~500 ms interpolation would say nor the 90 ms since its own last commit."""
    clock = LsnClock(100)
    for t in range(7):
        clock.record(1000 + 100 * t, now=float(t))
    commits = Commits(last_replayed=5.91, newest_seen=5.99, interval=0.08)
    reading = estimate(clock, 1590, now=6.0, commits=commits)
    assert reading is not None and reading.seconds == pytest.approx(0.01, abs=0.001), reading


def test_idle_primary_adds_no_points() -> None:
    clock = LsnClock(100)
    clock.record(1000, now=1.0)
    for t in range(2, 60):
        clock.record(1000, now=float(t))
    assert len(clock) == 1
    assert estimate(clock, 999, now=60.0) == Staleness(59.0, "history_start")
    assert seconds(clock, 1000, now=60.0) == 0.0


def test_stuck_replica_grows_with_wall_time_after_writes_stop() -> None:
    clock = LsnClock(100)
    for t in range(10):
        clock.record(1000 + 100 * t, now=float(t))
    for t in range(10, 40):
        clock.record(1900, now=float(t))  # writes stopped at t=9
    for now in (20.0, 30.0, 39.0):  # it replayed a commit at 2.4
        assert seconds(clock, 1250, now, last_commit_at=2.4) == pytest.approx(now - 2.5)
        assert seconds(clock, 1250, now) == pytest.approx(now - 3)  # no commit known: the lower bound


def test_clock_bounded_keeps_its_first_point_and_stays_bounded() -> None:
    clock = LsnClock(200)
    for i in range(5000):
        clock.record(100 * (i + 1), now=float(i))
        assert len(clock) <= 200
    # The first point stays: a replica behind it reads the time since the history began.
    assert estimate(clock, 99, now=5000.0) == Staleness(5000.0, "history_start")
    # Recent history is interpolated ...
    assert seconds(clock, 100 * 4990, now=5000.0, last_commit_at=4988.9) == pytest.approx(5000.0 - 4989.0)
    # ... older history within a small fraction, never over.
    for stuck_at in (100, 100 * 1000, 100 * 2500, 100 * 4800):
        truth = 5000.0 - (stuck_at / 100 - 1)  # byte stuck_at was written just after t = stuck_at/100 - 1
        got = seconds(clock, stuck_at, now=5000.0)
        assert 0.93 * truth <= got <= truth + 1e-9, (stuck_at, got, truth)


def test_clock_full_stuck_replica_keeps_growing() -> None:
    """A replica stuck while the primary writes on, far past the clock's capacity: its
    staleness keeps growing with wall time instead of flattening at the clock's horizon."""
    clock = LsnClock(400)
    clock.record(1000, now=0.0)
    readings = []
    for t in range(1, 20_000):
        clock.record(1000 + t, now=float(t))
        readings.append(seconds(clock, 1000, now=float(t)))
    truths = [t - 0.0 for t in range(1, 20_000)]  # byte 1000 was written in (0, 1]
    assert all(r <= truth for r, truth in zip(readings, truths, strict=True))
    assert all(r >= 0.9 * (truth - 1) for r, truth in zip(readings, truths, strict=True))
    assert readings[-1] > 15_000


def test_a_week_at_one_second_fits_the_trackers_bound_and_reads_within_a_64th() -> None:
    from lagwatch.estimate.history import CLOCK_MAX_POINTS as _CLOCK_MAX_POINTS

    clock = LsnClock(_CLOCK_MAX_POINTS)
    week = 7 * 86_400
    for i in range(week + 1):  # a primary writing 1,000 bytes between every two polls
        clock.record(i * 1000, now=float(i))
    assert len(clock) <= _CLOCK_MAX_POINTS
    for age in (1, 10, 63, 64, 100, 1000, 3600, 20_000, 86_400, week - 1):
        truth = float(age)  # the first byte after LSN (week - age) * 1000 - 1 was seen at week - age
        reading = seconds(clock, (week - age) * 1000 - 1, now=float(week))
        assert truth * (1 - 1 / 64) <= reading <= truth, age
        if age < 64:
            assert reading == truth  # the last 64 polls stay exact


def test_clock_thins_as_it_goes_instead_of_filling_its_bound_first() -> None:
    """A fleet's memory: the clock holds what 1/64 of age needs (a few hundred points in
    the first hour at 1 s), not its whole bound from the 1,536th poll on."""
    from lagwatch.estimate.history import CLOCK_MAX_POINTS as _CLOCK_MAX_POINTS

    clock = LsnClock(_CLOCK_MAX_POINTS)
    sizes = []
    for i in range(3601):
        clock.record(i * 1000, now=float(i))
        sizes.append(len(clock))
    assert max(sizes) <= 800
    assert sizes[255] == 256  # the first 256 polls are all kept
    for age in (1, 63, 100, 1000, 3599):
        reading = seconds(clock, (3600 - age) * 1000 - 1, now=3600.0)
        assert age * (1 - 1 / 64) <= reading <= age, age


def test_clock_empty_is_unknown_and_never_negative() -> None:
    clock = LsnClock(10)
    assert estimate(clock, 5, now=1.0) is None
    clock.record(10, now=5.0)
    assert seconds(clock, 5, now=4.0) == 0.0


def test_nearest_rank() -> None:
    values = sorted(float(v) for v in range(1, 101))
    assert nearest_rank(values, 0.5) == 50.0
    assert nearest_rank(values, 0.95) == 95.0
    assert nearest_rank(values, 0.99) == 99.0
    assert nearest_rank(values, 1.0) == 100.0
    assert nearest_rank([7.0], 0.95) == 7.0


def test_window_quantiles_match_fed_samples_and_expire() -> None:
    window = LagWindow(window=60.0, max_samples=1000)
    for i in range(100):  # one sample a second, values 0..99
        window.add(now=float(i), value=float(i))
    stats = window.stats(now=99.0)
    assert stats is not None
    # Only samples with t >= 39 remain: 39..99 (61 values).
    kept = [float(v) for v in range(39, 100)]
    assert stats.count == len(kept)
    for q in (0.5, 0.95, 0.99, 1.0):
        assert stats.get(q) == nearest_rank(kept, q)
    assert stats.get(1.0) == 99.0
    assert window.stats(now=1000.0) is None


def test_window_is_bounded_by_count() -> None:
    window = LagWindow(window=1e9, max_samples=10)
    for i in range(50):
        window.add(float(i), float(i))
    assert len(window.values(49.0)) == 10


def test_histogram_cumulative_and_consistent_with_samples() -> None:
    hist = LagHistogram()
    samples = [0.0, 0.0005, 0.003, 0.2, 0.5, 1.0, 3.0, 700.0]
    for s in samples:
        hist.observe(s)
    snap = hist.snapshot()
    assert snap.count == len(samples)
    assert snap.total == pytest.approx(sum(samples))
    assert snap.bounds[-1] == math.inf and snap.bounds[:-1] == LAG_BUCKETS
    for bound, count in zip(snap.bounds, snap.cumulative, strict=True):
        assert count == sum(1 for s in samples if s <= bound)
    assert list(snap.cumulative) == sorted(snap.cumulative)


def test_window_is_the_simple_definition_under_any_sequence_of_adds() -> None:
    """The array window with its bulk front cut against the plain definition: the samples
    of the last ``window`` seconds, at most ``max_samples`` of them, their nearest ranks."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    steps = st.lists(st.tuples(st.floats(0.0, 3.0), st.floats(0.0, 100.0), st.booleans()), max_size=300)

    @settings(max_examples=200, deadline=None)
    @given(st.floats(0.5, 20.0), st.integers(1, 40), steps)
    def check(span: float, most: int, adds: list[tuple[float, float, bool]]) -> None:
        window, kept, now = LagWindow(span, most), [], 0.0
        handed_out: list[tuple[LagSamples, list[tuple[float, float]]]] = []
        for dt, value, look in adds:
            now += dt
            window.add(now, value)
            kept = [(t, v) for t, v in kept + [(now, value)] if t >= now - span][-most:]
            if look:
                samples = window.samples(now)
                assert list(samples) == kept
                handed_out.append((samples, kept))
                stats = window.stats(now)
                assert stats is not None and stats.count == len(kept)
                for q in (0.5, 0.95, 0.99, 1.0):
                    assert stats.get(q) == nearest_rank(sorted(v for _, v in kept), q)
        later = now + span + 1
        assert window.stats(later) is None and len(window.samples(later)) == 0
        # A view handed out earlier still reads what it read then (views, not copies: the
        # window only appends to its arrays and replaces them to drop samples).
        for samples, then in handed_out:
            assert list(samples) == then and len(samples) == len(then)
            assert [samples[i] for i in range(-len(then), len(then))] == then + then

    check()


def test_samples_are_a_read_only_sequence_of_pairs() -> None:
    window = LagWindow(window=60.0, max_samples=100)
    for i in range(5):
        window.add(float(i), i / 10)
    samples = window.samples(4.0)
    assert isinstance(samples, LagSamples)
    assert len(samples) == 5 and samples[0] == (0.0, 0.0) and samples[-1] == (4.0, 0.4)
    assert list(samples[1:3]) == [(1.0, 0.1), (2.0, 0.2)] and list(samples[-2:]) == [(3.0, 0.3), (4.0, 0.4)]
    with pytest.raises(IndexError):
        samples[5]
    window.add(5.0, 0.5)  # a later add does not reach a view already handed out
    expected = [(float(i), i / 10) for i in range(5)]
    assert len(samples) == 5 and list(samples) == expected and samples == LagSamples(*_arrays(expected))
    assert not hasattr(samples, "append") and not hasattr(samples, "__setitem__")


def _arrays(pairs: list[tuple[float, float]]) -> tuple[array[float], array[float]]:
    return array("d", (t for t, _ in pairs)), array("d", (v for _, v in pairs))



def test_one_window_sizing() -> None:
    """A window keeps twice the polls it spans and some to spare (windows.window_samples,
    which the replicas' and the logical consumers' windows both use)."""
    from lagwatch.estimate.windows import window_samples

    assert [window_samples(w, i) for w, i in ((60, 1), (10, 0.1), (300, 0.25))] == [136, 216, 2416]
