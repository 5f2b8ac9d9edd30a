"""The tracker folding canned observations, and the collector on a fresh registry."""

from __future__ import annotations

from dataclasses import replace

import pytest
from lagwatch.config import parse_config
from lagwatch.estimate.snapshot import NodeObservation, Snapshot
from lagwatch.estimate.tracker import ClusterTracker
from lagwatch.estimate.windows import CYCLE_BUCKETS, LagHistogram
from lagwatch.rooms.slots import Slot
from lagwatch.serve.export import SnapshotCollector
from lagwatch.views.replication import WalSender
from lagwatch.views.server import ServerPosition
from lagwatch.views.wal_receiver import WalReceiver
from prometheus_client import CollectorRegistry, generate_latest

CONFIG = parse_config({"interval": "1s", "window": "1m", "clusters": [{
    "name": "main", "primary": {"dsn": "host=p"},
    "replicas": [{"name": "replica1", "dsn": "host=r1"}, {"name": "replica2", "dsn": "host=r2"}]}]})


def sender(name: str, current: int, replay: int, state: str = "streaming") -> WalSender:
    return WalSender(application_name=name, client_addr=None, state=state, sync_state="async", slot_name=name,
                     current_lsn=current, sent_lsn=current, write_lsn=current, flush_lsn=current, replay_lsn=replay,
                     write_lag=None, flush_lag=None, replay_lag=None)


def primary(at: float, lsn: int, senders: tuple[WalSender, ...] = (), slots: tuple[Slot, ...] = ()) -> NodeObservation:
    return NodeObservation(cluster="main", node="primary", role="primary", observed_at=at, duration=0.001,
                           position=ServerPosition(False, lsn, None, None, None, None), walsenders=senders,
                           rooms={"slots": slots})


def replica(name: str, at: float, replay: int, paused: bool = False, streaming: bool = True) -> NodeObservation:
    return NodeObservation(cluster="main", node=name, role="replica", observed_at=at, duration=0.001,
                           position=ServerPosition(True, None, replay, replay, "paused" if paused else "not paused",
                                                   100.0),
                           receiver=WalReceiver("streaming" if streaming else None))


def down(name: str, at: float) -> NodeObservation:
    return NodeObservation(cluster="main", node=name, role="replica", observed_at=at, duration=0.8,
                           error_kind="timeout", error="no answer")


def test_staleness_paused_replica_vs_healthy() -> None:
    tracker = ClusterTracker(CONFIG.clusters[0], 1.0, 60.0)
    # t=0..10: primary advances 100 bytes a second; replica1 stuck at 100 from t=1 on.
    for t in range(11):
        lsn = 100 * (t + 1)
        snap = tracker.update([primary(t, lsn), replica("replica1", t, min(lsn, 100), paused=t > 0),
                               replica("replica2", t, lsn)], now=t)
    r1, r2 = snap.replicas
    # The primary was first seen past 100 at t=1.
    assert r1.staleness == 9.0 and r1.staleness_source == "replica" and r1.replay_paused
    assert r2.staleness == 0.0
    assert r1.window is not None and r1.window.get(1.0) == 9.0 and r1.window.count == 11
    assert r1.histogram.count == 11


def test_steady_stream_reads_below_the_interval_and_says_how() -> None:
    """A steady stream polled once a second: replica1 applies 60 ms late, replica2 keeps
    up. The poll alone would date replica1's oldest unreplayed byte at the poll that first
    saw it (0 s); bytes between the polls place it 60 ms back, and the last commit it
    replayed (the primary's clock, read in the same cycle) caps it."""
    tracker = ClusterTracker(CONFIG.clusters[0], 1.0, 60.0)
    rate, epoch0 = 100_000, 1_700_000_000.0
    for t in range(6):
        lsn = rate * t
        primary_obs = replace(primary(t, lsn), position=ServerPosition(False, lsn, None, None, None, None,
                                                                       clock_epoch=epoch0 + t))
        behind = lsn - int(0.06 * rate)
        r1 = replace(replica("replica1", t, behind), position=ServerPosition(
            True, None, lsn, behind, "not paused", 0.07, last_replay_epoch=epoch0 + t - 0.065))
        snap = tracker.update([primary_obs, r1, replica("replica2", t, lsn)], now=t)
    r1_state, r2_state = snap.replicas
    assert r1_state.staleness == pytest.approx(0.06) and r1_state.staleness_evidence == "interpolated"
    assert r1_state.staleness_at == 5
    assert r2_state.staleness == 0 and r2_state.staleness_evidence == "caught_up"
    # Had the replica replayed a commit made 30 ms ago, what it lacks is younger than that.
    r1 = replace(replica("replica1", 6, 6 * rate - 6000), position=ServerPosition(
        True, None, 6 * rate, 6 * rate - 6000, "not paused", 0.03, last_replay_epoch=epoch0 + 6 - 0.03))
    snap = tracker.update([replace(primary(6, 6 * rate), position=ServerPosition(
        False, 6 * rate, None, None, None, None, clock_epoch=epoch0 + 6)), r1, replica("replica2", 6, 6 * rate)], now=6)
    assert snap.replicas[0].staleness == pytest.approx(0.03)
    assert snap.replicas[0].staleness_evidence == "commit_timestamp"
    _, text = render(Snapshot(0.0, 0.001, 7, 0, (snap,)))
    assert 'lag_evidence="commit_timestamp"' in text


def test_unreachable_replica_falls_back_to_primary_then_last_known() -> None:
    tracker = ClusterTracker(CONFIG.clusters[0], 1.0, 60.0)
    tracker.update([primary(0, 100, (sender("replica1", 100, 100),)), replica("replica1", 0, 100),
                    replica("replica2", 0, 100)], now=0)
    snap = tracker.update([primary(1, 200, (sender("replica1", 200, 150),)), down("replica1", 1),
                           replica("replica2", 1, 200)], now=1)
    r1 = snap.replicas[0]
    assert r1.staleness_source == "primary" and r1.node_up is False and r1.streaming is True
    snap = tracker.update([primary(5, 300), down("replica1", 5), replica("replica2", 5, 300)], now=5)
    r1 = snap.replicas[0]
    assert r1.staleness_source == "last_known" and r1.staleness == 4.0 and r1.streaming is False


def test_replica_behind_before_lagwatch_started_reads_at_least_the_walsender_replay_lag() -> None:
    """At start the LSN clock has no history: a replica already far behind would read ~0.
    The walsender's replay_lag (the primary's own measure) is then the floor; once the
    clock's history covers the replica's replay LSN, the clock alone decides."""
    tracker = ClusterTracker(CONFIG.clusters[0], 1.0, 60.0)
    behind = replace(sender("replica1", 5000, 100), replay_lag=3600.0)
    snap = tracker.update([primary(0, 5000, (behind,)), replica("replica1", 0, 100), replica("replica2", 0, 5000)],
                          now=0)
    assert snap.replicas[0].staleness == 3600.0
    assert snap.replicas[1].staleness == 0.0
    # It catches up past where our history starts: from then on the clock is exact.
    caught_up = replace(sender("replica1", 6000, 5500), replay_lag=3600.0)
    snap = tracker.update([primary(10, 6000, (caught_up,)), replica("replica1", 10, 5500),
                           replica("replica2", 10, 6000)], now=10)
    assert snap.replicas[0].staleness == 0.0  # the primary was never seen past 5500 before t=10


def test_unconfigured_walsender_appears_and_vanishes() -> None:
    tracker = ClusterTracker(CONFIG.clusters[0], 1.0, 60.0)
    snap = tracker.update([primary(0, 100, (sender("stranger", 100, 100),))], now=0)
    assert [r.name for r in snap.replicas] == ["replica1", "replica2", "stranger"]
    assert snap.replicas[2].configured is False and snap.replicas[2].node_up is None
    snap = tracker.update([primary(1, 100)], now=1)
    assert [r.name for r in snap.replicas] == ["replica1", "replica2"]


def render(snapshot: Snapshot) -> tuple[CollectorRegistry, str]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snapshot))
    return registry, generate_latest(registry).decode()


def test_collector_renders_snapshot_and_drops_vanished_series() -> None:
    tracker = ClusterTracker(CONFIG.clusters[0], 1.0, 60.0)
    slot = Slot("inactive", "physical", None, None, False, False, "reserved", 1000, 5000, None, None, None, None)
    tracker.update([primary(0, 100, (sender("stranger", 100, 100),), (slot,)), replica("replica1", 0, 100),
                    down("replica2", 0)], now=0)
    tracker.update([primary(1, 200, (sender("stranger", 200, 100),), (slot,)),
                    replica("replica1", 1, 100, paused=True), down("replica2", 1)], now=1)
    # replica1 stuck at 100; the primary was first seen past it at t=1.
    cluster = tracker.update([primary(3, 300, (sender("stranger", 300, 100),), (slot,)),
                              replica("replica1", 3, 100, paused=True), down("replica2", 3)], now=3)
    snapshot = Snapshot(taken_at=1.0, cycle_duration=0.01, cycles_total=2, overruns_total=0, clusters=(cluster,))
    registry, text = render(snapshot)
    get = registry.get_sample_value
    assert get("lagwatch_replica_lag_seconds", {"cluster": "main", "replica": "replica1"}) == 2.0
    assert get("lagwatch_replica_replay_paused", {"cluster": "main", "replica": "replica1"}) == 1.0
    assert get("lagwatch_replica_lag_window_seconds",
               {"cluster": "main", "replica": "replica1", "quantile": "1"}) == 2.0
    # Samples so far: 0 (t=0), 0 (t=1), 2 (t=3).
    assert get("lagwatch_replica_lag_sampled_seconds_count", {"cluster": "main", "replica": "replica1"}) == 3.0
    assert get("lagwatch_replica_lag_sampled_seconds_sum", {"cluster": "main", "replica": "replica1"}) == 2.0
    assert get("lagwatch_replica_lag_sampled_seconds_bucket",
               {"cluster": "main", "replica": "replica1", "le": "2.5"}) == 3.0
    assert get("lagwatch_replica_lag_sampled_seconds_bucket",
               {"cluster": "main", "replica": "replica1", "le": "1.0"}) == 2.0
    assert get("lagwatch_up", {"cluster": "main", "node": "replica2"}) == 0.0
    assert get("lagwatch_poll_errors_total", {"cluster": "main", "node": "replica2", "kind": "timeout"}) == 3.0
    assert get("lagwatch_replica_lag_bytes", {"cluster": "main", "replica": "stranger", "stage": "replay"}) == 200.0
    assert get("lagwatch_replica_configured", {"cluster": "main", "replica": "stranger"}) == 0.0
    assert get("lagwatch_slot_retained_bytes", {"cluster": "main", "slot": "inactive"}) == 5000.0
    assert get("lagwatch_slot_active", {"cluster": "main", "slot": "inactive"}) == 0.0
    assert "as of last poll" in text and "lagwatch_cycles_total 2.0" in text

    # Next cycle the stranger is gone and the slot dropped: so are their series.
    cluster = tracker.update([primary(4, 300), replica("replica1", 4, 300), down("replica2", 4)], now=4)
    registry, text = render(Snapshot(2.0, 0.01, 3, 0, (cluster,)))
    assert 'replica="stranger"' not in text and 'slot="inactive"' not in text


def test_cycle_durations_are_a_histogram_since_start() -> None:
    durations = LagHistogram(CYCLE_BUCKETS)
    for seconds in (0.04, 0.2, 0.2, 0.6):
        durations.observe(seconds)
    registry, _ = render(Snapshot(taken_at=1.0, cycle_duration=0.6, cycles_total=5, overruns_total=0, clusters=(),
                                  cycle_histogram=durations.snapshot()))
    get = registry.get_sample_value
    assert get("lagwatch_cycle_seconds_bucket", {"le": "0.05"}) == 1.0
    assert get("lagwatch_cycle_seconds_bucket", {"le": "0.2"}) == 3.0
    assert get("lagwatch_cycle_seconds_bucket", {"le": "0.5"}) == 3.0
    assert get("lagwatch_cycle_seconds_bucket", {"le": "+Inf"}) == 4.0
    assert get("lagwatch_cycle_seconds_count", {}) == 4.0 and get("lagwatch_cycle_seconds_sum", {}) == 1.04


def test_collector_before_first_poll_is_empty() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: None))
    assert generate_latest(registry) == b""


def test_primary_lsn_going_back_restarts_the_clock() -> None:
    # A failover to a replica that was behind: the new primary's LSN is lower.
    tracker = ClusterTracker(CONFIG.clusters[0], 1.0, 60.0)
    for t in range(5):
        tracker.update([primary(t, 1000 + 100 * t), replica("replica1", t, 1000 + 100 * t),
                        replica("replica2", t, 1000 + 100 * t)], now=t)
    for t in range(5, 15):
        snap = tracker.update([primary(t, 500), replica("replica1", t, 500), replica("replica2", t, 500)], now=t)
    assert [r.staleness for r in snap.replicas] == [0.0, 0.0]


def test_unconfigured_walsender_named_like_a_configured_replica_gets_its_own_label() -> None:
    config = parse_config({"clusters": [{
        "name": "main", "primary": {"dsn": "host=p"},
        "replicas": [{"name": "replica1", "application_name": "r1_walsender", "dsn": "host=r1"}]}]})
    tracker = ClusterTracker(config.clusters[0], 1.0, 60.0)
    snap = tracker.update([primary(0, 100, (sender("r1_walsender", 100, 100), sender("replica1", 100, 50))),
                           replica("replica1", 0, 100)], now=0)
    assert [(r.name, r.configured) for r in snap.replicas] == [("replica1", True),
                                                               ("replica1 (not configured)", False)]


def test_a_cycle_without_the_primarys_answer_still_reads_commit_timestamps() -> None:
    """The primary's poll failed this cycle. Its clock as last read still dates the
    replicas' commits: replica1, behind where the primary was last seen, is bounded by the
    commit it replayed (made inside the bracket, with a later one replayed elsewhere);
    replica2, past it, keeps its last reading (what the primary wrote since, nobody read)."""
    tracker = ClusterTracker(CONFIG.clusters[0], 0.1, 60.0)

    def answered(name: str, at: float, replay: int, last_commit: float) -> NodeObservation:
        obs = replica(name, at, replay)
        assert obs.position is not None
        return replace(obs, position=replace(obs.position, last_replay_epoch=last_commit))

    def primary_at(at: float, lsn: int) -> NodeObservation:
        obs = primary(at, lsn)
        assert obs.position is not None
        return replace(obs, position=replace(obs.position, clock_epoch=990.0 + at))  # our 10.0 is its 1000.0

    tracker.update([primary_at(9.9, 900), answered("replica1", 9.9, 900, 999.85),
                    answered("replica2", 9.9, 900, 999.85)], 9.9)
    tracker.update([primary_at(10.0, 1000), answered("replica1", 10.0, 900, 999.85),
                    answered("replica2", 10.0, 1000, 999.95)], 10.0)
    failed = NodeObservation(cluster="main", node="primary", role="primary", observed_at=10.15, duration=0.15,
                             error_kind="query", error="canceling statement due to conflict")
    snap = tracker.update([failed, answered("replica1", 10.15, 950, 999.99),
                           answered("replica2", 10.15, 1200, 1000.05)], 10.15)
    r1, r2 = snap.replicas
    assert r1.staleness == pytest.approx(0.16) and r1.staleness_evidence == "commit_timestamp"
    assert (r2.staleness, r2.staleness_evidence, r2.staleness_at) == (0.0, "caught_up", 10.0)


def test_the_commit_interval_follows_a_stream_that_starts_after_an_idle_spell() -> None:
    """25 s with only lagwatch's own poll transactions (1 a second), then 200 commits a
    second, counted in pg_stat_database in one-second lumps: within 3 s of the stream the
    interval is that of the stream, not the 30-s mean (which would be ~14 ms and, taken off
    the commit estimate, read a 20 ms lag as 6 ms)."""
    from lagwatch.estimate.history import LagHistory

    history = LagHistory("main", 0.1, 10.0)
    t, total = 0.0, 0.0
    while t < 25.0:
        t += 0.1
        total = float(int(t))  # one poll transaction a second, flushed each second
        history.note_xacts(t, total)
    assert 0.5 <= history.commit_interval() <= 1.0  # lumps make it read short, never long
    start_total = total
    while t < 28.0:
        t += 0.1
        total = start_total + 200.0 * int(t - 25.0)  # the stream's commits, in 1-s lumps
        history.note_xacts(t, total)
    assert history.commit_interval() <= 1.5 / 200, history.commit_interval()


def test_a_slot_without_a_limit_shows_its_share_of_pg_wal_and_one_with_a_limit_its_runway() -> None:
    from lagwatch.rooms.wal_dir import WalDir

    unlimited = Slot("archiver", "physical", None, None, False, False, "reserved", None, 48 << 20, None, None, None,
                     None)
    limited = Slot("replica1", "physical", None, None, True, False, "reserved", 200 << 20, 16 << 20, None, None, None,
                   None)
    tracker = ClusterTracker(CONFIG.clusters[0], 1.0, 60.0)
    for t in range(3):
        obs = replace(primary(float(t), 1000 + t * 1000),
                      rooms={"wal_dir": WalDir(64 << 20, 4), "slots": (unlimited, limited)})
        snap = tracker.update([obs, replica("replica1", float(t), 1000), replica("replica2", float(t), 1000)], float(t))
    registry, _ = render(Snapshot(1.0, 0.001, 1, 0, (snap,)))
    share = registry.get_sample_value("lagwatch_slot_wal_dir_share", {"cluster": "main", "slot": "archiver"})
    assert share == pytest.approx(0.75)  # 48 of the 64 MiB in pg_wal
    assert registry.get_sample_value("lagwatch_slot_wal_dir_share", {"cluster": "main", "slot": "replica1"}) is None
    assert registry.get_sample_value("lagwatch_slot_runway_seconds", {"cluster": "main", "slot": "archiver"}) is None


def test_the_text_exposition_reads_back_as_written_with_hostile_label_values() -> None:
    """lagwatch.render.exposition writes the text format itself: prometheus_client's parser reads
    back every name, label (quotes, backslashes, newlines escaped), value (+Inf, NaN) and
    help text, and a family made again under the same name while collecting is the one."""
    import math

    from lagwatch.render.exposition import Counter, Gauge, Histogram, Info, collecting
    from lagwatch.render.text import render_text
    from prometheus_client.parser import text_string_to_metric_families

    nasty = 'a "quoted"\\back\nslash'
    with collecting() as made:
        for cluster in ("c1", nasty):
            g = Gauge("lagwatch_x_seconds", 'help with \\ and\nnewline', labels=["cluster", "state"])
            g.add_metric([cluster, "up"], math.inf)
            g.add_metrics([cluster], [("a", 1.0), ("b", math.nan)])
            Counter("lagwatch_n", "a counter", labels=["cluster"]).add_metric([cluster], 7)
            Info("lagwatch_i", "an info", labels=["cluster"]).add_metric([cluster], {})
            Histogram("lagwatch_h_seconds", "a histogram", labels=["cluster"]).add_metric(
                [cluster], [("0.5", 1), ("+Inf", 3)], sum_value=2.25)
    assert list(made) == ["lagwatch_x_seconds", "lagwatch_n", "lagwatch_i", "lagwatch_h_seconds"]
    parsed = {f.name: f for f in text_string_to_metric_families(render_text(made.values()).decode())}
    x = parsed["lagwatch_x_seconds"]
    assert x.documentation == "help with \\ and\nnewline"
    got = {(s.labels["cluster"], s.labels["state"]): s.value for s in x.samples}
    assert got[(nasty, "up")] == math.inf and got[(nasty, "a")] == 1.0 and math.isnan(got[(nasty, "b")])
    assert len(got) == 6
    assert {s.name: s.value for s in parsed["lagwatch_n"].samples if s.labels["cluster"] == nasty} == {
        "lagwatch_n_total": 7.0}
    assert [s.labels["cluster"] for s in parsed["lagwatch_i_info"].samples] == ["c1", nasty]  # a gauge, as 0.0.4 has it
    h = [(s.name, s.labels.get("le"), s.value) for s in parsed["lagwatch_h_seconds"].samples
         if s.labels["cluster"] == nasty]
    assert h == [("lagwatch_h_seconds_bucket", "0.5", 1.0), ("lagwatch_h_seconds_bucket", "+Inf", 3.0),
                 ("lagwatch_h_seconds_count", None, 3.0), ("lagwatch_h_seconds_sum", None, 2.25)]


def test_a_departed_members_state_is_dropped_under_churn() -> None:
    """Replicas renamed in every membership (a Patroni churning its member names): what the
    tracker keeps of departed ones stays bounded (history.DEPARTED_KEPT of them, each one
    window), measured as the memory lagwatch's own code holds (tracemalloc). Before, each
    name's history, node counters and conflict totals were kept one whole window: here,
    some 2 KB a name, and growing with every answer."""
    import gc
    import logging
    import tracemalloc

    tracker = ClusterTracker(CONFIG.clusters[0], 1.0, 60.0)

    def churn(first: int, answers: int) -> None:
        for n in range(first, first + answers):
            names = [f"m{n:04d}-{i}" for i in range(8)]
            tracker.cluster = parse_config({"interval": "1s", "window": "1m", "clusters": [{
                "name": "main", "primary": {"dsn": "host=p"},
                "replicas": [{"name": name, "dsn": "host=r"} for name in names]}]}).clusters[0]
            tracker.update([primary(n, 100), *(down(name, n) for name in names)], now=float(n))

    ours = [tracemalloc.Filter(True, "*/lagwatch/*")]
    tracemalloc.start()
    logging.disable(logging.CRITICAL)  # the "down" lines, which pytest's log capture would keep
    try:
        churn(0, 10)  # past DEPARTED_KEPT departed names, within one window
        gc.collect()
        before = tracemalloc.take_snapshot().filter_traces(ours)
        churn(10, 40)  # 320 names more, all departed within the window
        gc.collect()
        after = tracemalloc.take_snapshot().filter_traces(ours)
    finally:
        logging.disable(logging.NOTSET)
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    print(f"lagwatch's own memory grew {grown} bytes over 320 departed names")
    assert grown < 320 * 50, [str(s) for s in after.compare_to(before, "lineno")[:8]]


def test_the_wal_rate_dates_the_primarys_answers_by_its_clock_not_by_when_they_came_in() -> None:
    """1 MB/s written, the primary read every second: its answers are taken in 1 to 90 ms
    late (a busy host), unevenly. Dated when they came in, the rate over a few seconds
    would be off by the difference (up to 3 %); dated when the primary's own clock says
    they were true (readinstant.py), it is the rate written."""
    tracker = ClusterTracker(CONFIG.clusters[0], 1.0, 60.0)
    rate, epoch0 = 1 << 20, 1_700_000_000.0
    late = [0.001, 0.090, 0.001, 0.060, 0.001, 0.002, 0.090]
    for t, delay in enumerate(late):
        lsn = rate * t
        obs = replace(primary(float(t), lsn), asked_at=float(t) - 0.0005, answered_at=t + delay,
                      position=ServerPosition(False, lsn, None, None, None, None, clock_epoch=epoch0 + t))
        snap = tracker.update([obs, replica("replica1", t + delay, lsn), replica("replica2", t + delay, lsn)],
                              now=t + delay)
    assert snap.wal_rate_bytes_per_second == pytest.approx(rate, rel=1e-3)
