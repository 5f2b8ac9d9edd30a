"""Rates and forecasts from byte positions (lagwatch.estimate.rates), the clock passed in."""

from __future__ import annotations

import math

import pytest
from lagwatch.estimate.rates import CAUGHT_UP_BYTES, Progress, catch_up, describe, runway


def test_the_rate_is_over_the_horizon_and_forgets_what_went_back() -> None:
    p = Progress(horizon=10)
    assert p.rate() is None
    for t in range(0, 30):
        p.add(float(t), 1000.0 * t)
    assert p.rate() == pytest.approx(1000.0)
    p.add(30.0, 5.0)  # another server: the history means nothing
    assert p.rate() is None


def test_after_a_pause_the_rate_is_the_one_since_replay_moved_again() -> None:
    p = Progress(horizon=60)
    for t in range(0, 10):  # paused: replay stands still
        p.add(float(t), 1000.0)
    for t in range(10, 15):  # resumed: 5 MB/s
        p.add(float(t), 1000.0 + 5e6 * (t - 9))
    assert p.rate_since_stall() == pytest.approx(5e6)
    assert p.rate() is not None and p.rate() < 5e6 / 2  # the plain rate mixes in the pause


def test_catch_up_eta_and_words() -> None:
    fine = catch_up(CAUGHT_UP_BYTES, 1e6, 1e6)
    assert fine.eta_seconds == 0.0 and describe(fine) == "caught up"
    gaining = catch_up(40_000_000, 3e6, 2e6)
    assert gaining.eta_seconds == pytest.approx(40.0) and describe(gaining) == "catching up, ~40 s"
    losing = catch_up(40_000_000, 1e6, 3e6)
    assert losing.falling_behind and math.isinf(losing.eta_seconds or 0)
    assert describe(losing) == "falling behind, 1.9 MB/s"
    assert catch_up(40_000_000, None, 1e6).eta_seconds is None
    assert describe(catch_up(4_000_000_000, 2e6, 1e6)) == "catching up, ~67 min"


def test_runway_is_safe_size_over_the_net_rate() -> None:
    assert runway(64 * 2**20, 2 * 2**20) == pytest.approx(32.0)
    assert math.isinf(runway(64 * 2**20, 0.0) or 0)  # the consumer keeps up: not shrinking
    assert math.isinf(runway(64 * 2**20, -5.0) or 0)
    assert runway(0, 1.0) == 0.0
    assert runway(1.0, None) is None


def test_the_tracker_forecasts_a_slot_runway_and_a_replicas_catch_up() -> None:
    """Pure: a primary writing 1 MB/s, a slot with no consumer (its safe size shrinking
    1 MB/s from 64 MB), a replica replaying 3 MB/s from 20 MB behind. After 7 s: 57 MB of
    safe size is 57 s of runway, 6 MB behind gaining 2 MB/s is 3 s to catch up."""
    from lagwatch.config import parse_config
    from lagwatch.estimate.snapshot import NodeObservation, Snapshot
    from lagwatch.estimate.tracker import ClusterTracker
    from lagwatch.rooms.slots import Slot
    from lagwatch.serve.export import SnapshotCollector
    from lagwatch.views.server import ServerPosition
    from lagwatch.views.wal_receiver import WalReceiver
    from prometheus_client import CollectorRegistry

    cluster = parse_config({"clusters": [{"name": "main", "primary": {"dsn": "host=p"},
                                          "replicas": [{"name": "replica1", "dsn": "host=r"}]}]}).clusters[0]
    tracker = ClusterTracker(cluster, 1.0, 60.0, horizon=10.0)
    snap = None
    for t in range(0, 8):
        current = 100 * MB + t * MB
        slot = Slot("idle", "physical", None, None, False, False, "reserved", 64 * MB - t * MB, 5 * MB + t * MB,
                    None, None, None, None)
        replay = 80 * MB + t * 3 * MB
        obs = [NodeObservation("main", "primary", "primary", float(t), 0.001, asked_at=float(t),
                               position=ServerPosition(False, current, None, None, None, None),
                               rooms={"slots": (slot,)}),
               NodeObservation("main", "replica1", "replica", float(t), 0.001, asked_at=float(t),
                               position=ServerPosition(True, None, replay, replay, "not paused", None),
                               receiver=WalReceiver("streaming"))]
        snap = tracker.update(obs, float(t))
    (replica,) = snap.replicas
    assert replica.catch_up is not None
    assert replica.catch_up.backlog_bytes == 107 * MB - 101 * MB
    assert replica.catch_up.replay_rate == pytest.approx(3 * MB) and replica.catch_up.eta_seconds == pytest.approx(3.0)
    assert snap.rooms["slots"].runways["idle"] == pytest.approx(57.0)  # 57 MB left at 1 MB/s
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: Snapshot(1.0, 0.01, 1, 0, (snap,))))
    assert registry.get_sample_value("lagwatch_slot_runway_seconds", {"cluster": "main", "slot": "idle"}) == \
        pytest.approx(57.0)
    assert registry.get_sample_value("lagwatch_replica_catchup_eta_seconds",
                                     {"cluster": "main", "replica": "replica1"}) == pytest.approx(3.0)


MB = 1 << 20


def test_a_replica_an_interval_of_wal_behind_under_steady_writes_is_caught_up() -> None:
    # 4 MB/s written, 400 kB in flight when polled, replaying as fast as written: caught up.
    assert catch_up(400_000, 4e6, 4e6, within=0.5).eta_seconds == 0.0
    assert math.isinf(catch_up(4_000_000, 4e6, 4e6, within=0.5).eta_seconds or 0)  # a second behind: not


def _rate_since_stall_by_walking(samples: list[tuple[float, float]]) -> float | None:
    """The definition, walked over the horizon's samples (what Progress keeps incrementally)."""
    start = 0
    for i in range(1, len(samples)):
        if samples[i][1] <= samples[i - 1][1]:
            start = i
    if len(samples) - start < 2:
        return 0.0 if len(samples) >= 2 else None
    if len(samples) - start >= 3:
        start += 1
    (t0, v0), (t1, v1) = samples[start], samples[-1]
    return (v1 - v0) / (t1 - t0) if t1 > t0 else None


def test_rates_kept_incrementally_are_the_walked_definition() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from lagwatch.estimate.rates import Progress

    steps = st.lists(st.tuples(st.floats(0.05, 3.0), st.sampled_from([0, 0, 5, 100, 1000, -1, -10_000])),
                     min_size=1, max_size=120)

    # Short horizons too: the kept samples are dropped and the arrays replaced many times
    # between two steps back.
    @settings(max_examples=300, deadline=None)
    @given(steps, st.sampled_from([2.0, 5.0, 20.0]))
    def check(moves: list[tuple[float, int]], seconds: float) -> None:
        progress, at, value = Progress(horizon=seconds), 0.0, 1_000_000.0
        horizon: list[tuple[float, float]] = []  # the samples by definition
        for dt, dv in moves:
            at, value = at + dt, value + dv
            progress.add(at, value)
            if horizon and value < horizon[-1][1] - 0.5:
                horizon.clear()  # went back: a new history
            horizon.append((at, value))
            while len(horizon) > 2 and at - horizon[1][0] >= seconds:
                del horizon[0]
            assert len(progress) == len(horizon)
            assert progress.rate_since_stall() == _rate_since_stall_by_walking(horizon)
            (t0, v0), (t1, v1) = horizon[0], horizon[-1]
            assert progress.rate() == (None if len(horizon) < 2 or t1 <= t0 else (v1 - v0) / (t1 - t0))

    check()


def test_a_cycle_the_primary_misses_keeps_the_slots_rate_history() -> None:
    """The primary unanswered for a cycle (its answer late, a connection lost) says nothing
    about its slots: the next answer's runway is still over the whole horizon, not missing
    until two new samples make a rate (nor over one interval only)."""
    from lagwatch.config import parse_config
    from lagwatch.estimate.snapshot import NodeObservation
    from lagwatch.estimate.tracker import ClusterTracker
    from lagwatch.rooms.slots import Slot
    from lagwatch.views.server import ServerPosition

    cluster = parse_config({"clusters": [{"name": "main", "primary": {"dsn": "host=p"}, "replicas": []}]}).clusters[0]
    tracker = ClusterTracker(cluster, 1.0, 60.0, horizon=10.0)

    def answered(t: int) -> NodeObservation:
        written = 100 * MB + t * MB  # 1 MB/s, none of it released: the slot retains it all
        slot = Slot("idle", "physical", None, None, False, False, "reserved", 64 * MB - t * MB, 5 * MB + t * MB,
                    None, None, None, None)
        return NodeObservation("main", "primary", "primary", float(t), 0.001, asked_at=float(t),
                               position=ServerPosition(False, written, None, None, None, None),
                               rooms={"slots": (slot,)})

    for t in range(0, 6):
        snap = tracker.update([answered(t)], float(t))
    assert snap.rooms["slots"].runways["idle"] == pytest.approx(59.0)
    late = NodeObservation("main", "primary", "primary", 6.0, 0.8, error_kind="timeout", error="no answer")
    assert tracker.update([late], 6.0).rooms["slots"].runways == {}  # nothing known this cycle
    snap = tracker.update([answered(7)], 7.0)
    assert snap.rooms["slots"].runways["idle"] == pytest.approx(57.0)
