"""The optional heartbeat on real servers: off unless configured (nothing written, no
session); on, it holds every reading to within one beat of the oracle under OLTP load with
the WAL dating off, on a cascaded replica too; the WAL it writes a day, measured; a table
that is not there is said once and costs nothing else.

What it does not depend on is the server's version: its SQL is the same on every one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chaoscluster import ChaosCluster
from harness import Lagwatch, Readings, cluster_config, let_time_pass
from lagwatch.demo.ports import free_port
from loads import Oltp, create_heartbeat_table, prepare
from oracle import LagOracle

pytestmark = pytest.mark.one_pg_version

BEAT = 0.010  # the heartbeat interval these tests run at
SPAN = 8.0


@pytest.fixture(scope="module")
def beating(pg_cluster: ChaosCluster) -> ChaosCluster:
    create_heartbeat_table(pg_cluster)
    prepare(pg_cluster)
    return pg_cluster


def _config(cluster: ChaosCluster, *, interval: str = "1s", **cluster_keys: Any) -> dict[str, Any]:
    config = cluster_config(cluster, free_port(["127.0.0.1"]), interval=interval, window=f"{SPAN:g}s")
    config["clusters"][0].update(cluster_keys)
    return config


def _heartbeat_sessions(cluster: ChaosCluster) -> int:
    return int(cluster.primary.scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                                      "'lagwatch/main/heartbeat'"))


def test_off_unless_configured(beating: ChaosCluster, tmp_path: Path) -> None:
    rows = beating.primary.scalar("SELECT count(*) FROM lagwatch_heartbeat")
    with Lagwatch(tmp_path, _config(beating, interval="100ms")) as lw:
        lw.wait_ready()
        lw.wait_cycles(10)
        assert _heartbeat_sessions(beating) == 0
        assert beating.primary.scalar("SELECT count(*) FROM lagwatch_heartbeat") == rows


@pytest.fixture
def cascaded(beating: ChaosCluster) -> Iterator[ChaosCluster]:
    """replica2 streams from replica1 (the primary has no walsender for it)."""
    replica1, replica2 = beating.replicas
    replica2.alter_system("primary_slot_name", None)
    replica2.set_primary_conninfo(f"host={replica1.host} port={replica1.port} user=postgres "
                                  f"application_name={replica2.application_name}")
    try:
        yield beating
    finally:
        replica2.set_apply_delay(0)
        replica2.restore_auto_conf()
        beating.wait_replayed()


def test_the_heartbeat_holds_readings_within_a_beat(cascaded: ChaosCluster, tmp_path: Path) -> None:
    """The LSN clock alone at 1 s (the WAL dating off), OLTP and the oracle's writes, 40 ms
    apply delay on replica2, which cascades from replica1: every reading of both replicas
    within one beat (plus 5 ms of round trips) of the oracle's bounds."""
    replica2 = cascaded.replicas[1]
    replica2.set_apply_delay(0.04)
    config = _config(cascaded, lag_from_wal="off", heartbeat={"interval": f"{BEAT * 1000:g}ms", "id": "test"})
    (tmp_path / "lw").mkdir()
    with Lagwatch(tmp_path / "lw", config) as lw, Oltp(cascaded, tmp_path), \
            LagOracle(cascaded, tmp_path / "oracle") as oracle:
        lw.wait_ready()
        with Readings(lw) as readings:
            let_time_pass(2.0)  # the delay in force (the replica takes the reload in its own time)
            start = time.monotonic()
            let_time_pass(SPAN)  # the span judged
            lw.wait_cycles(1)
        log = oracle.read()
        assert _heartbeat_sessions(cascaded) == 1
        assert (lw.value("lagwatch_heartbeat_beats_total") or 0) > SPAN / BEAT / 2
    slack = BEAT + 0.005
    report, outside = [], []
    for replica in ("replica1", "replica2"):
        seen = [r for r in readings.of(replica, start) if log.covers(replica, r.at)]
        assert len(seen) >= SPAN / 2, (replica, seen)
        for r in seen:
            truth = log.truth(replica, r.at)
            if not truth.low - slack <= r.seconds <= truth.high + slack:
                outside.append(f"{replica}@{r.at:.3f}: {r.seconds * 1000:.1f} ms [{r.evidence}] vs "
                               f"{truth.low * 1000:.1f}..{truth.high * 1000:.1f}")
        report.append(f"{replica}: {len(seen)} readings, evidence {sorted({r.evidence for r in seen})}")
    print("\n".join(report))
    assert not outside, "\n".join(outside[:10] + report)


def test_the_wal_it_writes_a_day(beating: ChaosCluster, tmp_path: Path) -> None:
    """On an otherwise idle primary, the WAL the heartbeat writes at its default 25 ms,
    extrapolated to a day: printed (docs/lag.md quotes it) and under 1 GB."""
    config = _config(beating, heartbeat={"id": "wal-a-day"})
    with Lagwatch(tmp_path, config) as lw:
        lw.wait_ready()
        lw.wait_for("beating", lambda: (lw.value("lagwatch_heartbeat_beats_total") or 0) > 20, timeout=10)
        beating.primary.execute("CHECKPOINT")  # its full-page images now, not in the span measured
        before, started = str(beating.primary.scalar("SELECT pg_current_wal_lsn()")), time.monotonic()
        beats_before = lw.value("lagwatch_heartbeat_beats_total") or 0
        let_time_pass(5.0)  # five seconds of beats and nothing else
        written = int(beating.primary.scalar("SELECT pg_current_wal_lsn() - %s::pg_lsn", (before,)))
        elapsed = time.monotonic() - started
        beats = (lw.value("lagwatch_heartbeat_beats_total") or 0) - beats_before
    per_day = written / elapsed * 86400
    print(f"heartbeat at 25 ms: {beats:.0f} beats, {written} bytes of WAL in {elapsed:.1f} s: "
          f"{per_day / 1e9:.2f} GB a day ({written / max(beats, 1):.0f} bytes a beat)")
    assert beats >= 0.5 * elapsed / 0.025
    assert per_day < 1e9


def test_a_missing_table_is_said_once_and_costs_nothing_else(beating: ChaosCluster, tmp_path: Path) -> None:
    config = _config(beating, interval="100ms", heartbeat={"table": "lagwatch_no_such_table", "id": "x"})
    with Lagwatch(tmp_path, config) as lw:
        lw.wait_ready()
        lw.wait_cycles(20)
        text = lw.log_text()
        assert text.count("cannot write the heartbeat") == 1, text[-3000:]
        assert "deploy/sql/lagwatch-heartbeat.sql" in text
        assert lw.value("lagwatch_up", node="replica1") == 1 and lw.value("lagwatch_up", node="primary") == 1
        assert lw.value("lagwatch_replica_lag_seconds", replica="replica1") is not None
