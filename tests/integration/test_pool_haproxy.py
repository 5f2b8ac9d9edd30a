"""Pool control through a real HAProxy's runtime API, in front of real replicas.

One PostgreSQL major (``one_pg_version``): what is tested is lagwatch's decisions and
HAProxy's rotation, which do not depend on the server's version. Lagwatch polls every
200 ms with the SLA scaled to it (as in test_pool_pgbouncer.py), and how soon it acts is
counted in its own cycles (pool_timeline.py).
"""

from __future__ import annotations

import math
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
from lagwatch.poolers.haproxy import HAProxyPooler, parse_servers_state
from pool_timeline import CycleLog, above, below

INTERVAL = 0.2
MAX_LAG, READMIT_BELOW = 0.5, 0.25
SLA = {"max_lag": "500ms", "eject_after": 2, "readmit_below": "250ms", "readmit_after": 3, "min_replicas": 1}


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


def wait_rotation(haproxy: HAProxyServer, expected: set[str], timeout: float) -> None:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if in_rotation(haproxy) == expected:
            return
        time.sleep(0.05)
    raise AssertionError(f"HAProxy rotation {in_rotation(haproxy)} != {expected} after {timeout}s")


def test_eject_readmit_and_reapply_after_restart(pg_cluster: ChaosCluster, haproxy: HAProxyServer,
                                                 tmp_path: Path) -> None:
    r1, r2 = pg_cluster.replicas
    config = cluster_config(pg_cluster, free_port(["127.0.0.1"]), interval=f"{INTERVAL * 1000:.0f}ms",
                            state_dir=str(tmp_path / "state"))
    config["clusters"][0].update({
        "sla": SLA,
        "pooler": {"kind": "haproxy", "socket": str(haproxy.socket), "backend": "pg_ro",
                   "servers": {"replica1": "r1", "replica2": "r2"}},
    })
    maint = "HAProxy server pg_ro/r1 (replica1) set to maint"
    with Lagwatch(tmp_path, config) as lw:
        lw.wait_ready()
        paused = lw.cycles()
        r1.pause_replay()
        with Writer(pg_cluster):
            wait_rotation(haproxy, {"r2"}, timeout=15)
            # Reads through HAProxy now reach replica2 only.
            for _ in range(4):
                with psycopg.connect(f"host=127.0.0.1 port={haproxy.port} user=postgres dbname=postgres",
                                     connect_timeout=5) as conn:
                    row = conn.execute("SELECT inet_server_addr()::text").fetchone()
                    assert row is not None and str(row[0]).split("/")[0] == r2.host

            # HAProxy restarts and forgets its runtime state: lagwatch sees the pool differ
            # and applies it again.
            haproxy.restart()
            restarted = lw.cycles()
            wait_rotation(haproxy, {"r2"}, timeout=10)
            # It was lagwatch that put r1 back in maintenance: twice, once per HAProxy.
            lw.wait_logged(maint, count=2)
            assert lw.log_text().count(maint) == 2
        resumed = lw.cycles()
        r1.resume_replay()
        wait_rotation(haproxy, {"r1", "r2"}, timeout=15)
        lw.expect("lagwatch_pool_changes_total", 1, replica="replica1", action="eject")
        lw.expect("lagwatch_pool_changes_total", 1, replica="replica1", action="readmit")
        lw.expect("lagwatch_pool_pooler_member", 1, replica="replica1")
        timeline = CycleLog.of(lw)
    # Out on the eject_after-th cycle over max_lag, back on the readmit_after-th below
    # readmit_below, neither sooner nor later (pool_timeline.py).
    ejected = timeline.assert_acted_after_streak("replica1", "eject", paused, above(MAX_LAG), SLA["eject_after"])
    assert timeline.cycle_of(maint, paused) == ejected  # applied in the cycle that decided it
    timeline.assert_acted_after_streak("replica1", "readmit", resumed, below(READMIT_BELOW), SLA["readmit_after"])
    # Put back by the first read-back of the restarted HAProxy's state: one is due at most
    # read_back_every (2 s) after the last, so within that many cycles at the interval
    # (a slower pace only means fewer), +1 for the poll time that may shorten the gap
    # between two cycles' clocks, +1 for the cycle under way at the restart, which may
    # have read the old HAProxy just before it went.
    reapplied = timeline.cycle_of(maint, paused, count=2)
    bound = math.ceil(HAProxyPooler.read_back_every / INTERVAL) + 2
    assert timeline.fresh(restarted + 1, reapplied) <= bound, timeline.excerpt("replica1", restarted, reapplied)
