"""Logical consumers in time, on real servers: a publication and a subscription between two
local clusters, and a change-data-capture client (pg_recvlogical, test_decoding) on a
logical slot of the same publisher.

- The subscription under a steady write load (the oracle's table published, pgbench's
  not), its apply held 40 ms of every 70 (a lock on the subscriber): its staleness within
  max(10 ms, 20 %) of the oracle (commits numbered on the publisher, read on the
  subscriber, one clock), p95 and median; disabled, it grows with wall time; enabled
  again, it falls back. Never in the replicas' series.
- Writes to unpublished tables only: the subscription does not read as lagging.
- pg_recvlogical stopped: its staleness and the slot's retained bytes grow, the slot shows
  how long it has been inactive (17+) and the time 18's idle timeout leaves it; its
  catalog_xmin holds the vacuum horizon (named, counted as the primary counts it, dated
  back to the stop) and LagwatchReplicationHoldsHorizon fires on a real Prometheus;
  dropped, it holds nothing.
- An apply error provoked for real (a row on the subscriber the publisher's insert
  conflicts with): the subscriber's error counter as PostgreSQL counts it, and
  LagwatchSubscriptionApplyErrors firing on a real Prometheus; the row removed, the
  subscription catches up.
- A failover slot (17+) synced to a standby with slot sync on; the standby's sync turned
  off: LagwatchFailoverSlotNotSynced fires on a real Prometheus.

The newest version only: what is read is the same from 15 on, and 17+ and 18 add the
slots' inactive_since, failover slots and the idle timeout.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from chaoscluster import ChaosCluster
from harness import ROOT, Lagwatch, Readings, cluster_config
from lagwatch.demo.binaries import find_binaries
from lagwatch.demo.cluster import LocalCluster
from lagwatch.demo.ports import free_port
from loads import Oltp, prepare
from oracle import TABLE, LagOracle, nearest_rank, tolerance
from prom_stack import Prometheus, rules_with_shorter_for

pytestmark = pytest.mark.newest_pg_version

PUBLICATION, SUBSCRIPTION, CDC_SLOT = "lw_pub", "lw_sub", "lw_cdc"
READ = "logical:" + SUBSCRIPTION  # its readings (harness.Readings)
RULES = ROOT / "alerts" / "lagwatch.rules.yml"
HORIZON_ALERT_XIDS = 100


class LogicalCluster(ChaosCluster):
    """A primary that can decode its WAL (wal_level logical), with its replicas."""

    def primary_settings(self) -> dict[str, str]:
        return {**super().primary_settings(), "wal_level": "logical"}


@pytest.fixture(scope="module")
def publisher(pg_major: int) -> Iterator[LogicalCluster]:
    with LogicalCluster(find_binaries(pg_major), replicas=1) as cluster:
        prepare(cluster)  # pgbench's tables: never published
        yield cluster


@pytest.fixture(scope="module")
def subscriber(pg_major: int, publisher: LogicalCluster) -> Iterator[LocalCluster]:
    """A second cluster subscribed to the publisher's oracle table."""
    with LocalCluster(find_binaries(pg_major), replicas=0) as cluster:
        ddl = f"CREATE TABLE {TABLE} (seq bigint PRIMARY KEY) WITH (autovacuum_enabled = off)"
        publisher.primary.execute(ddl)
        cluster.primary.execute(ddl)
        publisher.primary.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {TABLE}")
        cluster.primary.execute(f"CREATE SUBSCRIPTION {SUBSCRIPTION} CONNECTION '{publisher.primary.dsn()}' "
                                f"PUBLICATION {PUBLICATION}")
        deadline = time.monotonic() + 30
        while cluster.primary.scalar("SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'") != 0 \
                or not publisher.primary.scalar("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                                                (SUBSCRIPTION,)):
            assert time.monotonic() < deadline, "the subscription did not reach its streaming state"
            time.sleep(0.1)
        yield cluster


@pytest.fixture(scope="module")
def lagwatch(publisher: LogicalCluster, subscriber: LocalCluster,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lagwatch]:
    folder = tmp_path_factory.mktemp("lw")
    config = cluster_config(publisher, free_port(["127.0.0.1"]), interval="100ms", window="10s")
    config["clusters"][0]["horizon_alert_xids"] = HORIZON_ALERT_XIDS
    # The subscriber is a cluster lagwatch watches too: its subscriptions are read there.
    config["clusters"].append({"name": "subscriber", "primary": {"dsn": subscriber.primary.dsn()}, "replicas": [],
                               "sla": {"min_replicas": 0}})
    with Lagwatch(folder, config) as lw:
        lw.wait_ready()
        yield lw


class ApplyHeld:
    """Holds the subscription's apply in short bursts from a thread: a SHARE lock on the
    subscribed table (its inserts wait; the oracle's probe, a read, does not) for ``hold``
    seconds of every ``hold + run``, for at most ``seconds``."""

    def __init__(self, dsn: str, *, hold: float = 0.04, run: float = 0.03, seconds: float = 30) -> None:
        self.dsn, self.hold, self.run, self.seconds = dsn, hold, run, seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        deadline = time.monotonic() + self.seconds
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set() and time.monotonic() < deadline:
                with conn.transaction():
                    conn.execute(f"LOCK TABLE {TABLE} IN SHARE MODE")
                    self._stop.wait(self.hold)
                self._stop.wait(self.run)

    def __enter__(self) -> ApplyHeld:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def consumers(lw: Lagwatch) -> dict[str, dict[str, Any]]:
    return {c["slot"]: c for c in lw.status()["clusters"][0]["logical_consumers"]}


def as_replica(subscriber: LocalCluster) -> Any:
    """The oracle's cluster: the publisher writes, the subscriber is the one it probes."""
    return SimpleNamespace(name=SUBSCRIPTION, dsn=subscriber.primary.dsn)


def test_a_subscriptions_staleness_against_the_oracle_paused_and_resumed(
        publisher: LogicalCluster, subscriber: LocalCluster, lagwatch: Lagwatch, tmp_path: Path) -> None:
    lw = lagwatch
    oracle_view = SimpleNamespace(primary=publisher.primary, replicas=[as_replica(subscriber)],
                                  wait_replayed=lambda: None)
    pause = 3.0
    (tmp_path / "oltp").mkdir()
    with Oltp(publisher, tmp_path / "oltp", rate=100, clients=2, seconds=60), \
            LagOracle(oracle_view, tmp_path / "oracle", max_seconds=60) as oracle:  # type: ignore[arg-type]
        with Readings(lw, every=0.02) as readings:
            time.sleep(1.0)  # the load in force
            start = time.monotonic()
            with ApplyHeld(subscriber.primary.dsn(), seconds=10):
                time.sleep(4.0)
            steady_end = time.monotonic()
            subscriber.primary.execute(f"ALTER SUBSCRIPTION {SUBSCRIPTION} DISABLE")
            disabled_at = time.monotonic()
            time.sleep(pause)
            subscriber.primary.execute(f"ALTER SUBSCRIPTION {SUBSCRIPTION} ENABLE")
            enabled_at = time.monotonic()
            lw.wait_for("the subscription caught up again", lambda: (consumers(lw)[SUBSCRIPTION].get(
                "staleness_seconds") or 1.0) < 0.05, 30)
            time.sleep(1.0)
            end = time.monotonic()
        log = oracle.read(others=True)  # pgbench commits beside the writer (unpublished)
    seen = [r for r in readings.of(READ, start, end) if log.covers(SUBSCRIPTION, r.at)]
    assert len(seen) > 50, f"too few readings: {len(seen)}"
    assert [r["name"] for r in lw.status()["clusters"][0]["replicas"]] == ["replica1"], "a consumer among replicas"

    def within(span: list[Any], q: float) -> None:
        read = nearest_rank([r.seconds for r in span], q)
        truth = nearest_rank([log.truth(SUBSCRIPTION, r.at).mid for r in span], q)
        print(f"q{q}: read {read * 1000:.1f} ms, oracle {truth * 1000:.1f} ms ({len(span)} readings, "
              f"{sorted({r.evidence for r in span})})")
        assert abs(read - truth) <= tolerance(truth, 0.010, 0.20), (q, read, truth)

    steady = [r for r in seen if r.at <= steady_end]
    for q in (0.5, 0.95):
        within(steady, q)
        within(seen, q)
    # Disabled: the walsender is gone, the reading grows with wall time (dated from the
    # slot's position and the consumer's last applied one); enabled: it falls back.
    during = [r for r in seen if disabled_at + 0.5 <= r.at <= enabled_at]
    assert during and max(r.seconds for r in during) >= pause - 0.6, [round(r.seconds, 3) for r in during[-5:]]
    for r in during:
        truth = log.truth(SUBSCRIPTION, r.at)
        assert truth.low - tolerance(truth.low, 0.010, 0.20) <= r.seconds <= truth.high + tolerance(
            truth.high, 0.005, 0.10), (r, truth)
    after = [r for r in seen if r.at >= end - 0.8]
    assert after and max(r.seconds for r in after) < 0.05, after
    assert lw.value("lagwatch_logical_consumer_active", cluster="main", consumer=SUBSCRIPTION,
                    slot=SUBSCRIPTION) == 1
    assert lw.value("lagwatch_replica_lag_seconds", cluster="main", replica=SUBSCRIPTION) is None


def test_writes_outside_the_publication_do_not_read_as_lag(publisher: LogicalCluster, subscriber: LocalCluster,
                                                           lagwatch: Lagwatch, tmp_path: Path) -> None:
    lw = lagwatch
    (tmp_path / "oltp").mkdir()
    with Oltp(publisher, tmp_path / "oltp", rate=150, clients=2, seconds=30):
        with Readings(lw, every=0.02) as readings:
            time.sleep(5.0)
    seen = [r.seconds for r in readings.of(READ) if r.at >= readings.of(READ)[0].at + 1.0]
    assert len(seen) > 20
    print(f"unpublished writes only: p95 {nearest_rank(seen, 0.95) * 1000:.1f} ms, max {max(seen) * 1000:.1f} ms")
    # Nothing published is missing: the reading is the keepalive's round trip, not pgbench's pace.
    assert nearest_rank(seen, 0.95) < 0.05, sorted(seen)[-10:]


def test_a_stopped_cdc_client_grows_stale_and_holds_wal(publisher: LogicalCluster, lagwatch: Lagwatch,
                                                       tmp_path: Path) -> None:
    lw, primary = lagwatch, publisher.primary
    primary.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (CDC_SLOT,))
    out = tmp_path / "cdc.out"
    recv = [str(publisher.binaries.tool("pg_recvlogical")), "-d", primary.dsn(), "--slot", CDC_SLOT, "--start",
            "-f", str(out), "-F", "0", "-s", "1", "--no-loop"]
    proc = subprocess.Popen(recv)  # a client: it runs as anyone
    try:
        with contextlib.closing(psycopg.connect(primary.dsn(), autocommit=True)) as conn:
            for i in range(20):
                conn.execute(f"INSERT INTO {TABLE} VALUES ({10_000_000 + i})")
        lw.wait_for("pg_recvlogical confirmed what it read", lambda: (consumers(lw).get(CDC_SLOT, {}).get(
            "staleness_seconds") or 9.9) < 1.5 and consumers(lw)[CDC_SLOT]["active"], 20)
        assert consumers(lw)[CDC_SLOT]["consumer"] == "pg_recvlogical"
    finally:
        proc.terminate()
        proc.wait(10)
    stopped = time.monotonic()
    with contextlib.closing(psycopg.connect(primary.dsn(), autocommit=True)) as conn:
        for i in range(40):
            conn.execute(f"INSERT INTO {TABLE} VALUES ({20_000_000 + i})")
            time.sleep(0.05)
        for _ in range(2 * HORIZON_ALERT_XIDS):
            conn.execute("SELECT txid_current()")  # transactions its catalog_xmin falls behind
    lw.wait_for("the slot inactive", lambda: not consumers(lw)[CDC_SLOT]["active"], 10)
    first = consumers(lw)[CDC_SLOT]
    time.sleep(1.5)
    second = consumers(lw)[CDC_SLOT]
    grew = second["staleness_seconds"] - first["staleness_seconds"]
    elapsed = second["staleness_measured_at_monotonic"] - first["staleness_measured_at_monotonic"]
    # Nothing confirmed since it stopped: the staleness grows with wall time, one for one.
    assert abs(grew - elapsed) <= 0.05, (grew, elapsed)
    assert second["staleness_seconds"] <= time.monotonic() - stopped + 1.5
    slot = next(s for s in lw.status()["clusters"][0]["slots"] if s["name"] == CDC_SLOT)
    assert slot["retained_bytes"] > 0 and second["lag_bytes"] > 0
    # The catalog rows its decoding needs: the slot holds the vacuum horizon, named, as many
    # transactions back as the primary's own age(catalog_xmin), and for at least as long
    # as it has been stopped (it confirmed nothing since).
    holder = f"slot/{CDC_SLOT}"
    truth = int(primary.scalar("SELECT age(catalog_xmin) FROM pg_replication_slots WHERE slot_name = %s",
                               (CDC_SLOT,)))
    assert truth >= 2 * HORIZON_ALERT_XIDS + 40
    lw.expect("lagwatch_horizon_held_xids", truth, timeout=5, cluster="main", holder=holder)
    held_for = lw.value("lagwatch_horizon_held_seconds", cluster="main", holder=holder)
    since_stop = time.monotonic() - stopped
    assert held_for is not None and held_for >= since_stop - 0.3, (held_for, since_stop)
    prometheus = Prometheus([f"127.0.0.1:{lw.port}"], [rules_with_shorter_for(RULES, tmp_path, 300, floor=2.0)])
    prometheus.start()
    try:
        lw.wait_for("LagwatchReplicationHoldsHorizon firing for the stopped consumer's slot", lambda: any(
            a["labels"]["alertname"] == "LagwatchReplicationHoldsHorizon" and a["state"] == "firing"
            and a["labels"].get("holder") == holder for a in prometheus.alerts()), 30)
    finally:
        prometheus.stop()
    if publisher.binaries.major >= 18:
        # 18 invalidates a slot idle past idle_replication_slot_timeout (at a checkpoint): the
        # time it has left, from the slot's own inactive_since on the server's clock.
        primary.alter_system("idle_replication_slot_timeout", "1h")
        primary.reload()
        try:
            lw.wait_for("the idle timeout's time left", lambda: lw.value(
                "lagwatch_slot_idle_timeout_left_seconds", cluster="main", slot=CDC_SLOT) is not None, 10)
            left = lw.value("lagwatch_slot_idle_timeout_left_seconds", cluster="main", slot=CDC_SLOT)
            slots_now = {s["name"]: s for s in lw.status()["clusters"][0]["slots"]}
            inactive = slots_now[CDC_SLOT]["inactive_seconds"]
            assert left is not None and abs(left - (3600 - inactive)) <= 1.0, (left, inactive)
        finally:
            primary.alter_system("idle_replication_slot_timeout", None)
            primary.reload()
    if publisher.binaries.major >= 17:
        assert slot["inactive_seconds"] is not None and slot["inactive_seconds"] >= 1.0, slot
    primary.execute("SELECT pg_drop_replication_slot(%s)", (CDC_SLOT,))
    lw.wait_for("the dropped slot's consumer gone", lambda: CDC_SLOT not in consumers(lw), 10)
    # Released: the slot no longer holds the horizon.
    assert holder not in lw.status()["clusters"][0]["vacuum_horizon_held_xids"]


def test_an_apply_error_is_counted_and_alerts_on_prometheus(publisher: LogicalCluster, subscriber: LocalCluster,
                                                            lagwatch: Lagwatch, tmp_path: Path) -> None:
    lw, sub = lagwatch, subscriber.primary
    labels = {"cluster": "subscriber", "subscription": SUBSCRIPTION}

    def errors_counted() -> int:
        return int(sub.scalar("SELECT apply_error_count FROM pg_stat_subscription_stats WHERE subname = %s",
                              (SUBSCRIPTION,)))

    before = errors_counted()
    lw.expect("lagwatch_subscription_apply_errors_total", before, timeout=5, **labels)
    assert lw.value("lagwatch_subscription_worker_running", **labels) == 1
    prometheus = Prometheus([f"127.0.0.1:{lw.port}"], [rules_with_shorter_for(RULES, tmp_path, 60, floor=2.0)])
    prometheus.start()
    key = 99_000_000
    try:
        lw.wait_for("Prometheus has the error counter at its start", lambda: bool(prometheus.query(
            f'lagwatch_subscription_apply_errors_total{{subscription="{SUBSCRIPTION}"}}').get("data", {}).get(
            "result")), 20)
        time.sleep(2.0)  # a few samples before the first error: increase() counts from there
        sub.execute(f"INSERT INTO {TABLE} VALUES ({key})")  # the row the publisher's insert collides with
        publisher.primary.execute(f"INSERT INTO {TABLE} VALUES ({key})")
        lw.wait_for("the apply error counted by the subscriber", lambda: errors_counted() > before, 30)
        # lagwatch's counter is the subscriber's own, read one poll in ten.
        lw.wait_for("lagwatch's counter up with it", lambda: (lw.value(
            "lagwatch_subscription_apply_errors_total", **labels) or 0) > before, 10)
        assert lw.value("lagwatch_subscription_apply_errors_total", **labels) <= errors_counted()

        def firing() -> bool:
            return any(a["labels"]["alertname"] == "LagwatchSubscriptionApplyErrors" and a["state"] == "firing"
                       and a["labels"].get("subscription") == SUBSCRIPTION for a in prometheus.alerts())

        lw.wait_for("LagwatchSubscriptionApplyErrors firing on Prometheus", firing, 40)
        status = next(c for c in lw.status()["clusters"] if c["name"] == "subscriber")
        (row,) = [s for s in status["subscriptions"] if s["name"] == SUBSCRIPTION]
        assert row["enabled"] and row["apply_errors"] > before, row
    finally:
        prometheus.stop()
        sub.execute(f"DELETE FROM {TABLE} WHERE seq = {key}")
    lw.wait_for("the subscription applies again", lambda: sub.scalar(
        f"SELECT count(*) FROM {TABLE} WHERE seq = {key}") == 1, 30)


def test_a_failover_slot_is_synced_to_the_standby_and_alerts_when_its_sync_stops(
        publisher: LogicalCluster, lagwatch: Lagwatch, tmp_path: Path) -> None:
    lw, primary, standby = lagwatch, publisher.primary, publisher.replicas[0]
    if publisher.binaries.major < 17:
        pytest.skip("failover slots came in PostgreSQL 17")
    slot, labels = "lw_fo", {"cluster": "main", "replica": standby.name}
    # What slot sync needs on the standby: the setting, feedback, and a database to sync from.
    conninfo = str(standby.scalar("SHOW primary_conninfo"))
    standby.alter_system("sync_replication_slots", "on")
    standby.alter_system("hot_standby_feedback", "on")
    standby.set_primary_conninfo(f"{conninfo} dbname=postgres")
    primary.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding', false, false, true)", (slot,))
    prometheus = Prometheus([f"127.0.0.1:{lw.port}"], [rules_with_shorter_for(RULES, tmp_path, 60, floor=2.0)])
    prometheus.start()
    try:
        def consumed_and_synced() -> bool:
            # A new copy stays temporary until the primary's slot moves past where the standby
            # reserved it: consume it, as a CDC client would.
            primary.execute(f"INSERT INTO {TABLE} VALUES (nextval('lw_fo_seq'))")
            primary.execute("SELECT count(*) FROM pg_logical_slot_get_changes(%s, NULL, NULL)", (slot,))
            return lw.value("lagwatch_slot_synced", slot=slot, **labels) == 1

        primary.execute("CREATE SEQUENCE IF NOT EXISTS lw_fo_seq START 30000000")
        lw.wait_for("the failover slot synced to the standby", consumed_and_synced, 60)
        assert lw.value("lagwatch_replica_slot_sync_running", **labels) == 1
        replica = next(r for r in lw.status()["clusters"][0]["replicas"] if r["name"] == standby.name)
        assert replica["slot_sync"] == {"enabled": True, "worker": True, "synced": [slot]}, replica["slot_sync"]
        assert next(s for s in lw.status()["clusters"][0]["slots"] if s["name"] == slot)["failover"] is True
        # The standby stops syncing: its copy would be stale at a promotion.
        standby.alter_system("sync_replication_slots", "off")
        standby.reload()
        lw.expect("lagwatch_slot_synced", 0, timeout=15, slot=slot, **labels)
        assert lw.value("lagwatch_replica_slot_sync_running", **labels) == 0

        def firing() -> bool:
            return any(a["labels"]["alertname"] == "LagwatchFailoverSlotNotSynced" and a["state"] == "firing"
                       and a["labels"].get("slot") == slot for a in prometheus.alerts())

        lw.wait_for("LagwatchFailoverSlotNotSynced firing on Prometheus", firing, 40)
    finally:
        prometheus.stop()
        primary.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        for name in ("sync_replication_slots", "hot_standby_feedback"):
            standby.alter_system(name, None)
        standby.set_primary_conninfo(conninfo)
