"""The optional heartbeat on real servers, as the replicas read it: it holds every reading to
within one beat of the oracle under OLTP load with the WAL dating off, on a cascaded replica
too (a timing test). The writer (off unless configured, the WAL it writes, a table that is
missing, broken or planted) is tested in test_heartbeat_writer.py, which judges no timing.

What it does not depend on is the server's version: its SQL is the same on every one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from chaoscluster import ChaosCluster
from harness import Lagwatch, Readings, let_time_pass
from loads import Oltp, create_heartbeat_table, heartbeat_config, heartbeat_sessions, prepare
from oracle import LagOracle

pytestmark = pytest.mark.one_pg_version

BEAT = 0.010  # the heartbeat interval these tests run at
SPAN = 8.0


@pytest.fixture(scope="module")
def beating(pg_cluster: ChaosCluster) -> ChaosCluster:
    create_heartbeat_table(pg_cluster)
    prepare(pg_cluster)
    return pg_cluster


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
    config = heartbeat_config(cascaded, window=f"{SPAN:g}s", lag_from_wal="off",
                              heartbeat={"interval": f"{BEAT * 1000:g}ms", "id": "test"})
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
        assert heartbeat_sessions(cascaded) == 1
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
