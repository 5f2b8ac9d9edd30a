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


def test_clock_bounded_keeps_its_first_point_and_stays_bounded() -> None:
    clock = LsnClock(200)
    for i in range(5000):
        clock.record(100 * (i + 1), now=float(i))
        assert len(clock) <= 200
    assert clock.reaches_back_to(100) and not clock.reaches_back_to(99)
    # Recent history is exact to the poll ...
    assert clock.staleness(100 * 4990, now=5000.0) == pytest.approx(5000.0 - 4990.0)
    # ... older history within a small fraction, never over.
    for stuck_at in (100, 100 * 1000, 100 * 2500, 100 * 4800):
        truth = 5000.0 - stuck_at / 100  # first seen past it one record later
        got = clock.staleness(stuck_at, now=5000.0)
        assert got is not None and 0.93 * truth <= got <= truth, (stuck_at, got, truth)


def test_clock_full_stuck_replica_keeps_growing() -> None:
    """A replica stuck while the primary writes on, far past the clock's capacity: its
    staleness keeps growing with wall time instead of flattening at the clock's horizon."""
    clock = LsnClock(400)
    clock.record(1000, now=0.0)
    readings = []
    for t in range(1, 20_000):
        clock.record(1000 + t, now=float(t))
        readings.append(clock.staleness(1000, now=float(t)))
    truths = [t - 1.0 for t in range(1, 20_000)]  # the primary was first past 1000 at t=1
    assert all(r is not None and r <= truth for r, truth in zip(readings, truths, strict=True))
    assert all(r is not None and r >= 0.9 * truth for r, truth in zip(readings, truths, strict=True))
    assert readings[-1] is not None and readings[-1] > 15_000


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
