"""Forecasts against what then happens, on real servers: a replica's catch-up ETA against
the time it really takes to catch up, a replica that cannot catch up reading +Inf (and its
alert firing on a real Prometheus), and a slot's runway against the moment its wal_status
really becomes unreserved or lost.

WAL is written at a steady rate with pg_logical_emit_message (no table grows); the WAL a
replica gets is capped at a chosen rate by a relay between it and the primary (a replica on
a capped volume or link), so the oracle knows every rate. (Pausing and resuming replay
cannot throttle it: such records replay at GB/s, so any resume catches up at once.) What
is measured does not depend on the server version: one version runs these.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from chaoscluster import ChaosCluster
from harness import ROOT, Lagwatch, cluster_config, let_time_pass
from lagwatch.demo.ports import free_port
from lagwatch.demo.servers import LocalReplica
from prom_stack import Prometheus, rules_with_shorter_for
from throttled_link import ThrottledLink

pytestmark = pytest.mark.one_pg_version

INTERVAL = 0.5
RULES = ROOT / "alerts" / "lagwatch.rules.yml"
MB = 1 << 20


class SteadyWal(threading.Thread):
    """Writes ``rate`` bytes of WAL a second on the primary, in 10 steps a second."""

    def __init__(self, cluster: ChaosCluster, rate: float, max_seconds: float = 120) -> None:
        super().__init__(daemon=True)
        self.cluster, self.step = cluster, int(rate / 10)
        self.deadline = time.monotonic() + max_seconds
        self.stopped = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.cluster.primary.dsn(), autocommit=True) as conn:
            next_at = time.monotonic()
            while not self.stopped.is_set() and time.monotonic() < self.deadline:
                conn.execute("SELECT pg_logical_emit_message(false, 'lagwatch-test', repeat('x', %s))", (self.step,))
                next_at += 0.1
                self.stopped.wait(max(0.0, next_at - time.monotonic()))

    def __enter__(self) -> SteadyWal:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.join(10)


@pytest.fixture
def lagwatch(pg_cluster: ChaosCluster, tmp_path: Path) -> Iterator[Lagwatch]:
    config = cluster_config(pg_cluster, free_port(["127.0.0.1"]), interval=f"{int(INTERVAL * 1000)}ms", window="1m",
                            state_dir=str(tmp_path / "state"), forecast_horizon="5s")
    with Lagwatch(tmp_path, config) as lw:
        lw.wait_ready()
        yield lw


def backlog(cluster: ChaosCluster, replica: LocalReplica) -> int:
    """What the primary has written and the replica has not replayed, read from both."""
    current = int(cluster.primary.scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"))
    return current - int(replica.scalar("SELECT pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0')::bigint"))


def test_the_catch_up_eta_comes_true_and_a_replica_too_slow_reads_inf(pg_cluster: ChaosCluster,
                                                                       lagwatch: Lagwatch, tmp_path: Path) -> None:
    """... and the shipped LagwatchReplicaNotCatchingUp fires on a real Prometheus (its 5m
    for: 30 times shorter here; promtool's tests hold the real one)."""
    lw = lagwatch
    primary, r1 = pg_cluster.primary, pg_cluster.replicas[0]
    prometheus = Prometheus([f"127.0.0.1:{lw.port}"], [rules_with_shorter_for(RULES, tmp_path, factor=30)])
    prometheus.start()
    with contextlib.ExitStack() as stack, ThrottledLink(primary.host, primary.port) as link:
        stack.callback(prometheus.stop)
        r1.set_primary_conninfo(f"host={link.host} port={link.port} user=postgres "
                                f"application_name={r1.application_name}")
        lw.wait_for("replica1 streaming through the link", r1.is_streaming, 20)
        with SteadyWal(pg_cluster, 4 * MB):
            link.set_rate(0)  # held: replica1 gets nothing
            lw.wait_for("~32 MB behind", lambda: backlog(pg_cluster, r1) >= 32 * MB, 30)
            # 6 MB/s get through while 4 MB/s are written: the backlog shrinks at 2 MB/s (~16 s).
            link.set_rate(6 * MB)
            lw.wait_for("a finite catch-up ETA", lambda: 0 < (lw.value(
                "lagwatch_replica_catchup_eta_seconds", replica="replica1") or 0) < math.inf, 15)
            # A whole forecast horizon (5 s) into the catch-up: the replay rate is the link's
            # now, not partly the held spell's (an ETA read sooner is long by that spell).
            let_time_pass(5.5)
            predicted = lw.value("lagwatch_replica_catchup_eta_seconds", replica="replica1")
            predicted_at = time.monotonic()
            assert predicted is not None and 0 < predicted < math.inf, predicted
            status = next(r for r in lw.status()["clusters"][0]["replicas"] if r["name"] == "replica1")
            assert status["catch_up"]["summary"].startswith("catching up, ~"), status["catch_up"]
            # Caught up: less than a quarter second of writes behind, read from both servers.
            lw.wait_for("replica1 caught up", lambda: backlog(pg_cluster, r1) <= MB, 120)
            actual = time.monotonic() - predicted_at
            print(f"catch-up: ETA {predicted:.1f} s, took {actual:.1f} s")
            assert abs(predicted - actual) <= 0.3 * actual, (predicted, actual)
            lw.expect("lagwatch_replica_catchup_eta_seconds", 0, timeout=10, replica="replica1")

            # 2 MB/s get through while 4 MB/s are written: it never catches up.
            link.set_rate(2 * MB)
            lw.wait_for("ETA +Inf", lambda: lw.value("lagwatch_replica_catchup_eta_seconds", replica="replica1")
                        == math.inf, 20)
            # The rate is taken over the 5 s horizon: once that holds only the capped link, 2 MB/s.
            lw.wait_for("the replay rate of the capped link", lambda: 1.5 * MB < (lw.value(
                "lagwatch_replica_replay_rate_bytes_per_second", replica="replica1") or 0) < 2.5 * MB, 15)
            assert lw.value("lagwatch_replica_catchup_eta_seconds", replica="replica1") == math.inf
            status = next(r for r in lw.status()["clusters"][0]["replicas"] if r["name"] == "replica1")
            assert status["catch_up"]["falling_behind"] and status["catch_up"]["summary"].startswith(
                "falling behind, "), status["catch_up"]

            def firing() -> bool:
                return any(a["labels"]["alertname"] == "LagwatchReplicaNotCatchingUp" and a["state"] == "firing"
                           and a["labels"].get("replica") == "replica1" for a in prometheus.alerts())

            lw.wait_for("LagwatchReplicaNotCatchingUp firing on Prometheus", firing, 40)
        link.set_rate(None)


def test_a_slots_runway_ends_when_its_wal_becomes_unreserved(pg_cluster: ChaosCluster, lagwatch: Lagwatch) -> None:
    lw = lagwatch
    primary = pg_cluster.primary
    primary.alter_system("max_slot_wal_keep_size", "64MB")
    primary.reload()
    # A physical slot reserves from the last checkpoint's redo pointer: make that now.
    primary.execute("CHECKPOINT")
    primary.execute("SELECT pg_create_physical_replication_slot('forgotten', true)")  # no consumer, ever
    try:
        lw.wait_for("the slot's runway (not shrinking yet)", lambda: lw.value(
            "lagwatch_slot_runway_seconds", slot="forgotten") is not None, 10)
        with SteadyWal(pg_cluster, 3 * MB):
            let_time_pass(6)  # a whole forecast horizon (5 s) of writing: the net rate is the current one
            # From a cycle the primary answered (on a loaded machine one may come too late
            # for its cycle, which then says nothing of the slot).
            readings: list[float | None] = []
            lw.wait_for("the slot's runway", lambda: readings.append(
                lw.value("lagwatch_slot_runway_seconds", slot="forgotten")) or readings[-1] is not None, 2)
            predicted = readings[-1]
            predicted_at = time.monotonic()
            assert predicted is not None and 0 < predicted < math.inf, predicted

            def gone() -> bool:
                return primary.scalar("SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'forgotten'") \
                    in ("unreserved", "lost")

            lw.wait_for("wal_status unreserved or lost", gone, 120)
            actual = time.monotonic() - predicted_at
        print(f"slot runway: forecast {predicted:.1f} s, unreserved after {actual:.1f} s")
        assert abs(predicted - actual) <= 0.2 * actual, (predicted, actual)
    finally:
        primary.execute("SELECT pg_drop_replication_slot('forgotten')")
