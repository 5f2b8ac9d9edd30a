"""Pool control through a real HAProxy's runtime API, in front of real replicas."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from chaoscluster import ChaosCluster
from haproxy_server import HAProxyServer
from harness import Lagwatch, Writer, cluster_config
from lagwatch.demo.ports import free_port
from lagwatch.poolers.haproxy import parse_servers_state

INTERVAL = 1.0


pytestmark = pytest.mark.one_pg_version


@pytest.fixture
def haproxy(pg_cluster: ChaosCluster) -> Iterator[HAProxyServer]:
    r1, r2 = pg_cluster.replicas
    # A short folder: the admin socket path must fit in sun_path.
    with tempfile.TemporaryDirectory(prefix="lw-hx-") as folder, \
            HAProxyServer(Path(folder), "pg_ro", {"r1": (r1.host, r1.port), "r2": (r2.host, r2.port)}) as server:
        yield server


def in_rotation(haproxy: HAProxyServer) -> set[str]:
    states = parse_servers_state(haproxy.command("show servers state pg_ro"))
    return {name for name, state in states.items() if state.in_rotation}


def wait_rotation(haproxy: HAProxyServer, expected: set[str], timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if in_rotation(haproxy) == expected:
            return time.monotonic()
        time.sleep(0.1)
    raise AssertionError(f"HAProxy rotation {in_rotation(haproxy)} != {expected} after {timeout}s")


def test_eject_readmit_and_reapply_after_restart(pg_cluster: ChaosCluster, haproxy: HAProxyServer,
                                                 tmp_path: Path) -> None:
    r1, r2 = pg_cluster.replicas
    config = cluster_config(pg_cluster, free_port(["127.0.0.1"]), state_dir=str(tmp_path / "state"))
    config["clusters"][0].update({
        "sla": {"max_lag": "2s", "eject_after": 2, "readmit_below": "1s", "readmit_after": 3, "min_replicas": 1},
        "pooler": {"kind": "haproxy", "socket": str(haproxy.socket), "backend": "pg_ro",
                   "servers": {"replica1": "r1", "replica2": "r2"}},
    })
    with Lagwatch(tmp_path, config) as lw:
        lw.wait_ready()
        r1.pause_replay()
        with Writer(pg_cluster) as writer:
            assert writer.first_write_at is not None
            out_at = wait_rotation(haproxy, {"r2"}, timeout=15)
            assert out_at - (writer.first_write_at + 2.0) <= 3 * INTERVAL + 0.5
            # Reads through HAProxy now reach replica2 only.
            for _ in range(4):
                with psycopg.connect(f"host=127.0.0.1 port={haproxy.port} user=postgres dbname=postgres",
                                     connect_timeout=5) as conn:
                    row = conn.execute("SELECT inet_server_addr()::text").fetchone()
                    assert row is not None and str(row[0]).split("/")[0] == r2.host

            # HAProxy restarts and forgets its runtime state: lagwatch sees the pool differ
            # and applies it again.
            haproxy.restart()
            restarted = time.monotonic()
            wait_rotation(haproxy, {"r2"}, timeout=10)
            assert time.monotonic() - restarted <= 3 * INTERVAL + 1
            # It was lagwatch that put r1 back in maintenance: twice, once per HAProxy.
            lw.wait_logged("HAProxy server pg_ro/r1 (replica1) set to maint", count=2)
            assert lw.log_text().count("HAProxy server pg_ro/r1 (replica1) set to maint") == 2
        r1.resume_replay()
        wait_rotation(haproxy, {"r1", "r2"}, timeout=15)
        lw.expect("lagwatch_pool_changes_total", 1, replica="replica1", action="eject")
        lw.expect("lagwatch_pool_changes_total", 1, replica="replica1", action="readmit")
        lw.expect("lagwatch_pool_pooler_member", 1, replica="replica1")
