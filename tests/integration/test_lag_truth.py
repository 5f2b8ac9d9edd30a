"""Staleness against what was really done to real replicas (PostgreSQL 15 and 18).

One `lagwatch run` process (interval 1s) watches the module's cluster; each test makes lag
real (idle primary, paused replay, cut-off replica, cascading) and checks the exported numbers
against the times the test itself measured.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from harness import Lagwatch, Writer
from lagwatch.localcluster import LocalCluster

INTERVAL = 1.0


@pytest.fixture(scope="module")
def lagwatch(pg_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lagwatch]:
    lw = Lagwatch.for_cluster(tmp_path_factory.mktemp("lagwatch"), pg_cluster, interval="1s", window="1m")
    try:
        lw.wait_ready()
        yield lw
    finally:
        lw.stop()


def lag(lw: Lagwatch, replica: str) -> float | None:
    return lw.value("lagwatch_replica_lag_seconds", replica=replica)


def _labels(**labels: str) -> frozenset[tuple[str, str]]:
    return frozenset({"cluster": "main", **labels}.items())


def _at_most(value: float | None, limit: float) -> bool:
    return value is not None and value <= limit


def test_idle_primary_is_not_lag(pg_cluster: LocalCluster, lagwatch: Lagwatch) -> None:
    pg_cluster.primary.execute("CREATE TABLE IF NOT EXISTS lw_idle (x int); INSERT INTO lw_idle VALUES (1)")
    pg_cluster.wait_replayed()
    time.sleep(60)
    for replica in ("replica1", "replica2"):
        age = lagwatch.value("lagwatch_replica_last_replay_timestamp_age_seconds", replica=replica)
        assert age is not None and age > 50, f"the timestamp signal should have grown: {age}"
        staleness = lag(lagwatch, replica)
        assert staleness is not None and staleness <= INTERVAL, (replica, staleness)
        assert lagwatch.value("lagwatch_replica_streaming", replica=replica) == 1
        # The walsender's time lags are NULL while caught up and idle: exported as 0, not missing.
        for stage in ("write", "flush", "replay"):
            assert lagwatch.value("lagwatch_replica_walsender_lag_seconds", replica=replica, stage=stage) == 0


def test_paused_replay_grows_with_wall_time(pg_cluster: LocalCluster, lagwatch: Lagwatch) -> None:
    replica1 = pg_cluster.replicas[0]
    replica1.pause_replay()
    with Writer(pg_cluster) as writer:
        assert writer.first_write_at is not None
        first_unreplayed = writer.first_write_at
        for _ in range(8):
            time.sleep(1.0)
            expected = time.monotonic() - first_unreplayed
            got = lag(lagwatch, "replica1")
            assert got is not None and abs(got - expected) <= 2 * INTERVAL, (got, expected)
            other = lag(lagwatch, "replica2")
            assert other is not None and other <= INTERVAL, other
    assert lagwatch.value("lagwatch_replica_replay_paused", replica="replica1") == 1
    # What the slot-based exporters see: a paused replica still receives and flushes WAL,
    # so its slot retains (next to) nothing while its replay falls behind.
    retained = lagwatch.value("lagwatch_slot_retained_bytes", slot=replica1.slot_name)
    replay_bytes = lagwatch.value("lagwatch_replica_lag_bytes", replica="replica1", stage="replay")
    assert retained is not None and replay_bytes is not None and replay_bytes > 100_000
    assert retained < replay_bytes / 10, (retained, replay_bytes)
    # Writes have stopped: the oldest unreplayed change only gets older.
    time.sleep(15)
    expected = time.monotonic() - first_unreplayed
    got = lag(lagwatch, "replica1")
    assert got is not None and abs(got - expected) <= 2 * INTERVAL and got > 20, (got, expected)
    # The primary's replay_lag is not frozen into our headline, and the window saw it.
    p95 = lagwatch.value("lagwatch_replica_lag_window_seconds", replica="replica1", quantile="0.95")
    assert p95 is not None and p95 > 10

    replica1.resume_replay()
    resumed = time.monotonic()
    took = lagwatch.wait_for("both replicas back under 2 intervals",
                             lambda: all(_at_most(lag(lagwatch, r), 2 * INTERVAL) for r in ("replica1", "replica2")),
                             timeout=10)
    assert time.monotonic() - resumed <= 2 * INTERVAL + 0.5, took


def test_cut_off_replica_grows_and_is_not_streaming(pg_cluster: LocalCluster, lagwatch: Lagwatch) -> None:
    replica2 = pg_cluster.replicas[1]
    replica2.cut_off()
    with Writer(pg_cluster):
        lagwatch.wait_for("replica2 not streaming",
                          lambda: lagwatch.value("lagwatch_replica_streaming", replica="replica2") == 0, timeout=10)
        time.sleep(6)
        first = lag(lagwatch, "replica2")
        time.sleep(3)
        second = lag(lagwatch, "replica2")
    assert first is not None and second is not None
    assert first >= 4 and second >= first + 2, (first, second)
    assert lagwatch.value("lagwatch_replica_streaming", replica="replica2") == 0
    # The healthy replica is unaffected.
    assert _at_most(lag(lagwatch, "replica1"), INTERVAL)


def test_cascaded_replica_is_measured_end_to_end(pg_cluster: LocalCluster, lagwatch: Lagwatch) -> None:
    """replica2 streams from replica1 (cascading): the primary has no walsender for it, yet
    its own replay LSN still dates its staleness against the primary's WAL. With replica1
    cut off while the primary writes, replica2 keeps streaming (from replica1, which has
    nothing new) and its staleness still grows with wall time."""
    replica1, replica2 = pg_cluster.replicas
    replica2.alter_system("primary_slot_name", None)  # its slot lives on the primary
    replica2.set_primary_conninfo(f"host={replica1.host} port={replica1.port} user=postgres "
                                  f"application_name={replica2.application_name}")
    try:
        lagwatch.wait_for("replica2 cascading from replica1", lambda: replica2.is_streaming() and not any(
            row[0] == replica2.application_name
            for row in pg_cluster.primary.execute("SELECT application_name FROM pg_stat_replication")), timeout=20)
        with Writer(pg_cluster):
            time.sleep(4)
            assert _at_most(lag(lagwatch, "replica2"), 2 * INTERVAL)
            assert lagwatch.value("lagwatch_replica_streaming", replica="replica2") == 1
            # The primary cannot see it: no walsender-side signals for it.
            assert lagwatch.value("lagwatch_replica_lag_bytes", replica="replica2", stage="sent") is None

        replica1.cut_off()
        with Writer(pg_cluster) as writer:
            assert writer.first_write_at is not None
            for _ in range(6):
                time.sleep(1.0)
                expected = time.monotonic() - writer.first_write_at
                got = lag(lagwatch, "replica2")
                assert got is not None and abs(got - expected) <= 2 * INTERVAL, (got, expected)
            assert got is not None and got >= 4, got
            assert lagwatch.value("lagwatch_replica_streaming", replica="replica2") == 1
            assert lagwatch.value("lagwatch_replica_streaming", replica="replica1") == 0
    finally:
        replica1.reconnect(wait=True)
        replica2.restore_auto_conf()
        lagwatch.wait_for("replica2 back on the primary", lambda: any(
            row[0] == replica2.application_name
            for row in pg_cluster.primary.execute("SELECT application_name FROM pg_stat_replication "
                                                  "WHERE state = 'streaming'")), timeout=30)
        pg_cluster.wait_replayed()
    lagwatch.wait_for("both replicas caught up",
                      lambda: all(_at_most(lag(lagwatch, r), 2 * INTERVAL) for r in ("replica1", "replica2")),
                      timeout=10)


def test_inactive_slot_retains_wal_and_wal_stats_move(pg_cluster: LocalCluster, lagwatch: Lagwatch) -> None:
    before = lagwatch.samples()
    retained_before = before[("lagwatch_slot_retained_bytes", _labels(slot="inactive"))]
    with Writer(pg_cluster, every=0.05):
        time.sleep(3)
    time.sleep(1.5)
    after = lagwatch.samples()
    retained_after = after[("lagwatch_slot_retained_bytes", _labels(slot="inactive"))]
    assert retained_after > retained_before + 100_000, (retained_before, retained_after)
    # WAL counters: pg_stat_wal (14+) and pg_walinspect (installed by the fixture) both see the writes.
    for name in ("lagwatch_wal_bytes_total", "lagwatch_wal_records_total", "lagwatch_wal_inspected_bytes_total"):
        assert after[(name, _labels())] > before.get((name, _labels()), 0), name
    assert after[("lagwatch_wal_rate_bytes_per_second", _labels())] > 0
    assert after[("lagwatch_wal_directory_bytes", _labels())] > 0
    method = "pglz" if pg_cluster.binaries.major < 15 else pg_cluster.primary.scalar("SHOW wal_compression")
    assert after[("lagwatch_wal_compression_info", _labels(method=method))] == 1
    has_write_counters = ("lagwatch_wal_writes_total", _labels()) in after
    assert has_write_counters == (pg_cluster.binaries.major < 18)
    assert lagwatch.value("lagwatch_slot_active", slot="inactive") == 0
    assert lagwatch.value("lagwatch_slot_active", slot="replica1") == 1
    assert lagwatch.value("lagwatch_slot_safe_wal_size_bytes", slot="inactive") is not None
    assert lagwatch.value("lagwatch_slot_wal_status", slot="inactive", status="reserved") == 1
    # PostgreSQL 17+ says since when a slot is inactive.
    inactive_for = lagwatch.value("lagwatch_slot_inactive_seconds", slot="inactive")
    if pg_cluster.binaries.major >= 17:
        assert inactive_for is not None and inactive_for > 0
    else:
        assert inactive_for is None


def _answered(lw: Lagwatch, node: str) -> float:
    """Polls of ``node`` that got an answer: attempts minus failures of every kind."""
    samples = lw.samples()
    errors = sum(v for (name, labels), v in samples.items()
                 if name == "lagwatch_poll_errors_total" and ("node", node) in labels)
    return samples.get(("lagwatch_polls_total", _labels(node=node)), 0) - errors


def _sampled(lw: Lagwatch, replica: str) -> float:
    return lw.value("lagwatch_replica_lag_sampled_seconds_count", replica=replica) or 0


@pytest.mark.parametrize("how", ["stopped", "frozen"])
def test_unanswering_node_is_down_alone(pg_cluster: LocalCluster, lagwatch: Lagwatch, how: str) -> None:
    replica2 = pg_cluster.replicas[1]
    if how == "stopped":
        replica2.stop()
    else:
        replica2.freeze()  # a hung host: only the client-side deadline can save the cycle
    went = time.monotonic()
    lagwatch.wait_for("replica2 down", lambda: lagwatch.value("lagwatch_up", node="replica2") == 0, timeout=10)
    assert time.monotonic() - went <= 2 * INTERVAL + 0.5
    assert lagwatch.value("lagwatch_up", node="primary") == 1
    assert lagwatch.value("lagwatch_up", node="replica1") == 1
    # The other nodes keep their cadence: about one answered poll, and one staleness sample
    # of replica1, per interval.
    before = {"primary": _answered(lagwatch, "primary"), "replica1": _answered(lagwatch, "replica1"),
              "samples": _sampled(lagwatch, "replica1")}
    time.sleep(5.0)
    after = {"primary": _answered(lagwatch, "primary"), "replica1": _answered(lagwatch, "replica1"),
             "samples": _sampled(lagwatch, "replica1")}
    for what in before:
        assert 4 <= after[what] - before[what] <= 6, (what, before, after)
    assert lagwatch.value("lagwatch_up", node="replica2") == 0
    if how == "stopped":
        replica2.start()
    else:
        replica2.thaw()
    lagwatch.wait_for("replica2 back up", lambda: lagwatch.value("lagwatch_up", node="replica2") == 1, timeout=15)


def test_status_api_and_health(lagwatch: Lagwatch) -> None:
    status = lagwatch.status()
    assert status["ready"] is True
    (cluster,) = status["clusters"]
    names = [r["name"] for r in cluster["replicas"]]
    assert names == ["replica1", "replica2"]
    assert lagwatch.get("/healthz")[0] == 200
    assert lagwatch.get("/readyz")[0] == 200
    assert lagwatch.get("/nope")[0] == 404

