"""Smoke test of lagwatch.demo.cluster against real servers."""

from __future__ import annotations

import time

import psycopg
import pytest
from chaoscluster import ChaosCluster
from lagwatch.demo.servers import INACTIVE_SLOT


def _wait(pred: object, timeout: float = 10) -> bool:
    assert callable(pred)
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_topology_and_slots(pg_cluster: ChaosCluster) -> None:
    primary, (r1, r2) = pg_cluster.primary, pg_cluster.replicas
    assert (primary.host, r1.host, r2.host) == ("127.0.0.1", "127.0.0.2", "127.0.0.3")
    assert r1.port == r2.port != primary.port

    streaming = primary.execute(
        "SELECT application_name FROM pg_stat_replication WHERE state = 'streaming'"
    )
    assert sorted(a for (a,) in streaming) == ["replica1", "replica2"]

    for r in (r1, r2):
        addr, port, slot, status = r.execute(
            "SELECT host(inet_server_addr()), inet_server_port(), slot_name, status"
            " FROM pg_stat_wal_receiver"
        )[0]
        assert (addr, port, slot, status) == (r.host, r.port, r.name, "streaming")

    slots = {
        name: (active, has_restart)
        for name, active, has_restart in primary.execute(
            "SELECT slot_name, active, restart_lsn IS NOT NULL FROM pg_replication_slots"
        )
    }
    assert slots == {"replica1": (True, True), "replica2": (True, True), INACTIVE_SLOT: (False, True)}


def test_pause_and_resume_replay(pg_cluster: ChaosCluster) -> None:
    primary, r = pg_cluster.primary, pg_cluster.replicas[0]
    r.pause_replay()
    assert r.scalar("SELECT pg_get_wal_replay_pause_state()") == "paused"
    replayed = r.scalar("SELECT pg_last_wal_replay_lsn()")

    primary.execute("CREATE TABLE smoke_pause AS SELECT g AS id FROM generate_series(1, 1000) g")
    primary.execute("INSERT INTO smoke_pause SELECT g FROM generate_series(1001, 2000) g")
    target = primary.scalar("SELECT pg_current_wal_flush_lsn()")
    # WAL keeps arriving while paused; only replay stands still.
    assert _wait(lambda: r.scalar("SELECT pg_last_wal_receive_lsn() >= %s::pg_lsn", (target,)))
    assert r.scalar("SELECT pg_last_wal_replay_lsn()") == replayed
    assert r.scalar("SELECT to_regclass('smoke_pause')") is None

    r.resume_replay()
    pg_cluster.wait_replayed(timeout=10)
    assert r.scalar("SELECT count(*) FROM smoke_pause") == 2000
    primary.execute("DROP TABLE smoke_pause")


def test_freeze_and_thaw(pg_cluster: ChaosCluster) -> None:
    r = pg_cluster.replicas[1]
    r.freeze()
    try:
        assert r.is_frozen()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(r.dsn(), connect_timeout=2).close()
    finally:
        r.thaw()
    with psycopg.connect(r.dsn(), connect_timeout=2) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
