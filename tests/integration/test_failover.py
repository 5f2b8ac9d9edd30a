"""Roles change under a running lagwatch, on real servers: a failover with the old primary
stopped (multi-host primary DSN, PgBouncer pool, pgbench -S through it; the same three
servers also watched as clusters pooled by a real HAProxy, PgCat and PgDog configs and a
command pooler, which all follow), and a replica promoted while the old primary still
runs (split brain).

Roles do not depend on the server version: one version runs these."""

from __future__ import annotations

import copy
import re
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from chaoscluster import ChaosCluster
from haproxy_server import HAProxyServer
from harness import Lagwatch, Writer, cluster_config
from lagwatch.demo.ports import free_port
from lagwatch.poolers import pgcat, pgdog
from lagwatch.poolers.haproxy import parse_servers_state
from loads import PoolReads, create_read_table
from pgbouncer_server import PgBouncerServer, readable_by_servers

pytestmark = pytest.mark.one_pg_version

INTERVAL = 0.5


@pytest.fixture(scope="module")
def pgbouncer(pg_cluster: ChaosCluster) -> Iterator[PgBouncerServer]:
    server = PgBouncerServer(primary_dsn_entry=f"host=127.0.0.1 port={pg_cluster.primary.port} dbname=postgres")
    r1, r2 = pg_cluster.replicas
    server.include_file.write_text(f"app_ro = host={r1.host},{r2.host} port={r1.port} dbname=postgres\n")
    readable_by_servers(server.include_file)
    with server:
        yield server


@pytest.fixture(scope="module")
def haproxy(pg_cluster: ChaosCluster) -> Iterator[HAProxyServer]:
    r1, r2 = pg_cluster.replicas
    # A short folder: the admin socket path must fit in sun_path.
    with tempfile.TemporaryDirectory(prefix="lw-fo-") as folder, \
            HAProxyServer(Path(folder), "pg_ro", {"r1": (r1.host, r1.port), "r2": (r2.host, r2.port)}) as server:
        yield server


@pytest.fixture(scope="module")
def read_table(pg_cluster: ChaosCluster) -> str:
    return create_read_table(pg_cluster)


def failover_config(cluster: ChaosCluster, pgbouncer: PgBouncerServer, workdir: Path) -> dict[str, Any]:
    """The primary found among all three hosts, as an operator with no failover tool sets it."""
    servers = [cluster.primary, *cluster.replicas]
    config = cluster_config(cluster, free_port(["127.0.0.1"]), interval=f"{int(INTERVAL * 1000)}ms", window="1m",
                            state_dir=str(workdir / "state"))
    entry = config["clusters"][0]
    hosts, ports = ",".join(s.host for s in servers), ",".join(str(s.port) for s in servers)
    entry["primary"]["dsn"] = (f"host={hosts} port={ports} user=postgres dbname=postgres "
                               "target_session_attrs=read-write")
    entry["sla"] = {"max_lag": "2s", "eject_after": 2, "readmit_below": "1s", "readmit_after": 3, "min_replicas": 1}
    entry["pooler"] = {"kind": "pgbouncer", "admin_dsn": pgbouncer.admin_dsn,
                       "include_file": str(pgbouncer.include_file), "database": "app_ro",
                       "options": f"port={cluster.replicas[0].port} dbname=postgres"}
    return config


ADAPTERS = ("haproxy", "pgcat", "pgdog", "command")


def other_adapters(cluster: ChaosCluster, haproxy: HAProxyServer, entry: dict[str, Any],
                   workdir: Path) -> list[dict[str, Any]]:
    """The same servers as more clusters, ``via_KIND``, each pooled by another adapter (the
    PgCat/PgDog configs and the command's output are files; their reload is ``true``)."""
    old, (r1, r2) = cluster.primary, cluster.replicas
    (workdir / "pgcat.toml").write_text(
        "[general]\nport = 6432\n\n[pools.app.shards.0]\nservers = [\n"
        + "".join(f'    ["{s.host}", {s.port}, "{role}"],\n'
                  for s, role in ((old, "primary"), (r1, "replica"), (r2, "replica")))
        + ']\ndatabase = "postgres"\n')
    (workdir / "pgdog.toml").write_text("[general]\nport = 6432\n" + "".join(
        f'\n[[databases]]\nname = "app"\nhost = "{s.host}"\nport = {s.port}\nrole = "{role}"\n'
        for s, role in ((old, "primary"), (r1, "replica"), (r2, "replica"))))
    poolers = {
        "haproxy": {"kind": "haproxy", "socket": str(haproxy.socket), "backend": "pg_ro",
                    "servers": {"replica1": "r1", "replica2": "r2"}},
        "pgcat": {"kind": "pgcat", "config_file": str(workdir / "pgcat.toml"), "pool": "app",
                  "reload_command": ["true"]},
        "pgdog": {"kind": "pgdog", "config_file": str(workdir / "pgdog.toml"), "pool": "app",
                  "reload_command": ["true"]},
        "command": {"kind": "command", "template": "{members}\n", "output_file": str(workdir / "pool.txt"),
                    "reload_command": ["true"]},
    }
    return [{**copy.deepcopy(entry), "name": f"via_{kind}", "pooler": poolers[kind]} for kind in ADAPTERS]


def adapter_pool(kind: str, cluster: ChaosCluster, haproxy: HAProxyServer, workdir: Path) -> set[str]:
    """The replicas each adapter's pooler routes reads to, read from the pooler itself."""
    names = {(r.host, r.port): r.name for r in cluster.replicas}
    if kind == "haproxy":
        states = parse_servers_state(haproxy.command("show servers state pg_ro"))
        return {f"replica{name[1]}" for name, state in states.items() if state.in_rotation}
    if kind == "command":
        return set((workdir / "pool.txt").read_text().split())
    module = pgcat if kind == "pgcat" else pgdog
    return {names.get(address, str(address)) for address in
            module.replica_addresses((workdir / f"{kind}.toml").read_text(), "app")}


def app_ro_hosts(pgbouncer: PgBouncerServer) -> list[str]:
    return str(pgbouncer.show_databases()["app_ro"]["host"]).split(",")


class PoolWatcher:
    """Samples PgBouncer's app_ro hosts every 50 ms: the pool must never be empty."""

    def __init__(self, pgbouncer: PgBouncerServer) -> None:
        self.pgbouncer = pgbouncer
        self.seen: list[list[str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.seen.append(app_ro_hosts(self.pgbouncer))

    def __enter__(self) -> PoolWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def replayed(server: Any) -> int:
    return int(server.scalar("SELECT pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0')"))


def caught_up(lw: Lagwatch, replica: str) -> bool:
    lag = lw.value("lagwatch_replica_lag_seconds", replica=replica)
    return lag is not None and lag < 0.1


def replica_reading(lw: Lagwatch, replica: str) -> dict[str, Any]:
    """The replica's entry in /api/status, once it has a reading and the instant it is for."""
    found: dict[str, Any] = {}

    def read() -> bool:
        entry = next((r for r in lw.status()["clusters"][0]["replicas"] if r["name"] == replica), None)
        if entry is None or entry["staleness_seconds"] is None or entry["staleness_measured_at_monotonic"] is None:
            return False
        found.update(entry)
        return True

    lw.wait_for(f"{replica} read", read, timeout=10)
    return found


def cycles(lw: Lagwatch) -> float:
    return lw.daemon_value("lagwatch_cycles_total") or 0.0


def test_failover_with_the_old_primary_stopped(pg_cluster: ChaosCluster, pgbouncer: PgBouncerServer,
                                               haproxy: HAProxyServer, read_table: str, tmp_path: Path) -> None:
    old, (r1, r2) = pg_cluster.primary, pg_cluster.replicas
    config = failover_config(pg_cluster, pgbouncer, tmp_path)
    config["clusters"] += other_adapters(pg_cluster, haproxy, config["clusters"][0], tmp_path)
    lw = Lagwatch(tmp_path, config)
    bench = None
    try:
        lw.wait_ready()
        lw.wait_for("leadership", lambda: lw.value("lagwatch_leader") == 1, timeout=10)
        for kind in ADAPTERS:
            lw.wait_for(f"{kind} routes to both replicas", lambda k=kind: adapter_pool(  # type: ignore[misc]
                k, pg_cluster, haproxy, tmp_path) == {"replica1", "replica2"}, timeout=10)
        assert lw.value("lagwatch_node_role", node="replica1", role="replica") == 1
        assert lw.value("lagwatch_cluster_primaries") == 1
        with Writer(pg_cluster, every=0.05, max_seconds=10) as writer:
            writer.wait_commits(20)
        pg_cluster.wait_replayed()
        bench = PoolReads(pg_cluster, pgbouncer, read_table, tmp_path)
        bench.wait_reads_after(-1)
        with PoolWatcher(pgbouncer) as pool:
            old.stop()
            lw.wait_for("no primary", lambda: lw.value("lagwatch_cluster_primaries") == 0, timeout=10)
            r2_at_stop = replayed(r2)
            r1.promote()
            promoted_cycle = cycles(lw)
            with Writer(pg_cluster, every=0.05, max_seconds=30, on=r1):
                lw.wait_for("the promoted node seen as the primary",
                            lambda: lw.value("lagwatch_node_role", node="replica1", role="primary") == 1
                            and lw.value("lagwatch_cluster_primaries") == 1, timeout=10)
                # Within 3 intervals (counted in cycles, not seconds, on a shared machine).
                assert cycles(lw) - promoted_cycle <= 3, cycles(lw) - promoted_cycle
                # The multi-host primary DSN finds it too, once its reconnect backoff allows.
                lw.wait_for("the primary DSN on the new primary",
                            lambda: lw.value("lagwatch_node_role", node="primary", role="primary") == 1, timeout=10)
                assert lw.value("lagwatch_cluster_primaries") == 1  # one server under two names
                assert lw.value("lagwatch_node_timeline", node="replica1") == 2
                assert lw.value("lagwatch_cluster_role_changes_total") == 1
                # The promoted node is no lagging or down replica.
                assert lw.value("lagwatch_replica_lag_seconds", replica="replica1") is None
                names = [r["name"] for r in lw.status()["clusters"][0]["replicas"]]
                assert "replica1" not in names, names
                # replica2 still points at the stopped primary: it follows nobody and its
                # staleness against the new primary grows with wall time.
                lw.wait_cycles(3)
                first = replica_reading(lw, "replica2")
                lw.wait_cycles(2)
                second = replica_reading(lw, "replica2")
                # As much as time moved between the instants the two readings are for (what
                # lagwatch publishes beside each: no clock of the test's own, no cycle's
                # lateness in it). Nothing of replica2 moves, so the one commit dates both;
                # what may differ is the primary clock's offset, re-estimated between them
                # within the polls' round trips (milliseconds on loopback).
                assert second["staleness_seconds"] > first["staleness_seconds"], (first, second)
                grown = second["staleness_seconds"] - first["staleness_seconds"]
                moved = second["staleness_measured_at_monotonic"] - first["staleness_measured_at_monotonic"]
                print(f"replica2 grew {grown * 1000:.1f} ms in {moved * 1000:.1f} ms")
                assert abs(grown - moved) <= 0.020, (first, second)
                assert lw.value("lagwatch_replica_follows_primary", replica="replica2") == 0
                lw.expect("lagwatch_pool_member", 0, replica="replica1")
                # Re-pointed at the new primary (with the slot it uses), it follows and catches up.
                r1.execute("SELECT pg_create_physical_replication_slot(%s)", (r2.slot_name,))
                r2.set_primary_conninfo(f"host={r1.host} port={r1.port} user=postgres "
                                        f"application_name={r2.application_name}")
                lw.wait_for("replica2 follows the new primary",
                            lambda: lw.value("lagwatch_replica_follows_primary", replica="replica2") == 1, timeout=20)
                lw.wait_for("replica2 caught up", lambda: caught_up(lw, "replica2"), timeout=20)
                assert replayed(r2) > r2_at_stop
                lw.wait_for("replica2 in the pool", lambda: app_ro_hosts(pgbouncer) == [r2.host], timeout=20)
                # Every other adapter follows the same way: the promoted node out, replica2 in.
                for kind in ADAPTERS:
                    lw.wait_for(f"{kind} routes to replica2 only", lambda k=kind: adapter_pool(  # type: ignore[misc]
                        k, pg_cluster, haproxy, tmp_path) == {"replica2"}, timeout=10)
                # pgbench's clients (each on one connection since before the failover) read on after it.
                bench.wait_reads_after(len(bench.progress()))
        output = bench.stop()
        assert pool.seen and all(hosts and hosts != [""] for hosts in pool.seen), pool.seen  # never empty
        assert pool.seen[-1] == [r2.host]  # the new primary left the read pool
        assert old.host not in {h for hosts in pool.seen for h in hosts}
        reads = sum(tps for tps, _ in bench.progress())  # a report a second: transactions
        print(f"pgbench reading through PgBouncer during the failover: ~{reads:.0f} transactions in "
              f"{len(bench.progress())} reports, {sum(failed for _, failed in bench.progress())} failed")
        # The stopped node was never in the read pool, and the pool never emptied: no read
        # through it failed (a client that meets an error aborts and says so).
        assert not re.search(r"error|abort|fatal", output, re.I), output
        assert bench.progress() and all(failed == 0 for _, failed in bench.progress()), output
        log = lw.log_text()
        assert "main/replica1: role changed: was a replica, now a primary on timeline 2" in log
        assert re.search(r"main: the primary is now another server \((primary = )?replica1\), on timeline 2 \(was 1\)",
                         log), log
        assert "action=eject reason='promoted: it accepts writes now'" in log
        for kind in ADAPTERS:
            assert f"cluster=via_{kind} replica=replica1 action=eject reason='promoted: it accepts writes now'" in log
            assert lw.value("lagwatch_pool_member", cluster=f"via_{kind}", replica="replica1") == 0
            assert "Traceback" not in log
    finally:
        if bench is not None:
            bench.kill()
        lw.stop()
        # Back to the module's shape: the old primary, and both replicas re-cloned from it.
        old.start()
        for replica in (r1, r2):
            pg_cluster.rebuild_replica(replica)
        pg_cluster.wait_streaming()


def test_a_replica_promoted_while_the_primary_runs_is_a_split_brain(pg_cluster: ChaosCluster,
                                                                     pgbouncer: PgBouncerServer,
                                                                     tmp_path: Path) -> None:
    r2 = pg_cluster.replicas[1]
    with Lagwatch(tmp_path, failover_config(pg_cluster, pgbouncer, tmp_path)) as lw:
        lw.wait_ready()
        assert lw.value("lagwatch_cluster_primaries") == 1
        r2.promote()
        promoted_cycle = cycles(lw)
        lw.wait_for("two primaries", lambda: lw.value("lagwatch_cluster_primaries") == 2, timeout=10)
        assert cycles(lw) - promoted_cycle <= 2, cycles(lw) - promoted_cycle
        assert lw.value("lagwatch_node_role", node="replica2", role="primary") == 1
        # The primary DSN keeps finding the old primary first: it stays the one that counts.
        assert lw.value("lagwatch_node_timeline", node="primary") == 1
        assert lw.status()["clusters"][0]["primaries"] == 2
        assert "split brain: 2 servers accept writes" in lw.get("/status")[1]
        assert "main: split brain: 2 servers accept writes (primary, replica2)" in lw.log_text()
        lw.expect("lagwatch_pool_member", 0, replica="replica2")
        with psycopg.connect(r2.dsn(), autocommit=True) as conn:  # it really takes writes
            conn.execute("CREATE TABLE IF NOT EXISTS split_brain_probe (id int)")
