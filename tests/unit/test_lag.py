"""Window math, LSN clock and histogram, with a fake clock."""

import math

import pytest
from lagwatch.lag import LAG_BUCKETS, LagHistogram, LagWindow, LsnClock, nearest_rank


def test_clock_is_zero_when_replica_has_replayed_everything() -> None:
    clock = LsnClock(100)
    clock.record(1000, now=10.0)
    assert clock.staleness(1000, now=70.0) == 0.0
    assert clock.staleness(1500, now=70.0) == 0.0


def test_clock_measures_from_first_time_primary_was_past_replay() -> None:
    clock = LsnClock(100)
    clock.record(1000, now=10.0)
    clock.record(2000, now=11.0)
    clock.record(3000, now=12.0)
    # Replica at 1500: the primary was first seen past it at t=11.
    assert clock.staleness(1500, now=20.0) == pytest.approx(9.0)
    # Replica at exactly 2000 has replayed what was seen at 11; unreplayed starts at 12.
    assert clock.staleness(2000, now=20.0) == pytest.approx(8.0)


def test_idle_primary_adds_no_points_and_keeps_first_time() -> None:
    clock = LsnClock(100)
    clock.record(1000, now=1.0)
    for t in range(2, 60):
        clock.record(1000, now=float(t))
    assert len(clock) == 1
    assert clock.staleness(999, now=60.0) == pytest.approx(59.0)


def test_clock_bounded_gives_lower_bound_for_very_old_replay() -> None:
    clock = LsnClock(3)
    for i, t in enumerate([1.0, 2.0, 3.0, 4.0, 5.0]):
        clock.record(100 * (i + 1), now=t)
    assert len(clock) == 3
    # Replay LSN older than the oldest kept point (300 at t=3): lower bound from t=3.
    assert clock.staleness(50, now=10.0) == pytest.approx(7.0)


def test_clock_empty_is_unknown_and_never_negative() -> None:
    clock = LsnClock(10)
    assert clock.staleness(5, now=1.0) is None
    clock.record(10, now=5.0)
    assert clock.staleness(5, now=4.0) == 0.0


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
