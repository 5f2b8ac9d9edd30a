"""Pool control through a real PgBouncer (transaction pooling) in front of real replicas."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from chaoscluster import ChaosCluster
from harness import Lagwatch, Writer, cluster_config, let_time_pass, run_cli
from lagwatch.demo.ports import free_port
from oracle import LagOracle
from pgbouncer_server import PgBouncerServer, read_pool_for, readable_by_servers

INTERVAL = 1.0


pytestmark = pytest.mark.one_pg_version

SLA = {"max_lag": "2s", "eject_after": 2, "readmit_below": "1s", "readmit_after": 5, "min_replicas": 1}


@pytest.fixture(scope="module")
def pgbouncer(pg_cluster: ChaosCluster) -> Iterator[PgBouncerServer]:
    # The file lagwatch owns exists before PgBouncer starts, as an operator would set it up.
    with read_pool_for(pg_cluster) as server:
        yield server


@pytest.fixture(autouse=True)
def both_replicas_in_pool(pg_cluster: ChaosCluster, pgbouncer: PgBouncerServer) -> None:
    """Each test starts as an operator would have it: both replicas in app_ro."""
    r1, r2 = pg_cluster.replicas
    pgbouncer.include_file.write_text(f"app_ro = host={r1.host},{r2.host} port={r1.port} dbname=postgres\n")
    readable_by_servers(pgbouncer.include_file)
    if pgbouncer.proc is None:
        pgbouncer.start()
    with psycopg.connect(pgbouncer.admin_dsn, autocommit=True) as conn:
        conn.execute("RELOAD")


def pool_config(cluster: ChaosCluster, pgbouncer: PgBouncerServer, workdir: Path, **sla: Any) -> dict[str, Any]:
    config = cluster_config(cluster, free_port(["127.0.0.1"]), interval="1s", window="1m",
                            state_dir=str(workdir / "state"))
    dry_run = sla.pop("dry_run", False)
    config["clusters"][0].update({
        "sla": {**SLA, **sla},
        "dry_run": dry_run,
        "pooler": {"kind": "pgbouncer", "admin_dsn": pgbouncer.admin_dsn,
                   "include_file": str(pgbouncer.include_file), "database": "app_ro",
                   "options": f"port={cluster.replicas[0].port} dbname=postgres"},
    })
    return config


def app_ro_hosts(pgbouncer: PgBouncerServer) -> list[str]:
    return str(pgbouncer.show_databases()["app_ro"]["host"]).split(",")


def wait_hosts(pgbouncer: PgBouncerServer, predicate: Any, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate(app_ro_hosts(pgbouncer)):
            return time.monotonic()
        time.sleep(0.1)
    raise AssertionError(f"app_ro hosts still {app_ro_hosts(pgbouncer)} after {timeout}s")


def pause_both_until_the_primary_serves(pg_cluster: ChaosCluster, pgbouncer: PgBouncerServer) -> None:
    for replica in pg_cluster.replicas:
        replica.pause_replay()
    wait_hosts(pgbouncer, lambda hosts: hosts == [pg_cluster.primary.host], timeout=15)


def resume_both_until_both_serve(pg_cluster: ChaosCluster, pgbouncer: PgBouncerServer) -> None:
    for replica in pg_cluster.replicas:
        replica.resume_replay()
    wait_hosts(pgbouncer, lambda hosts: hosts == sorted(r.host for r in pg_cluster.replicas), timeout=20)


def read_addrs(pgbouncer: PgBouncerServer, n: int = 6) -> set[str]:
    out = set()
    for _ in range(n):
        with psycopg.connect(pgbouncer.dsn("app_ro"), autocommit=True, connect_timeout=5) as conn:
            row = conn.execute("SELECT inet_server_addr()::text").fetchone()
            assert row is not None
            out.add(str(row[0]).split("/")[0])
    return out


def start_pgbench(cluster: ChaosCluster, pgbouncer: PgBouncerServer, seconds: int, log: Path) -> subprocess.Popen[str]:
    pgbench = str(cluster.binaries.tool("pgbench"))
    return subprocess.Popen([pgbench, "-h", "127.0.0.1", "-p", str(pgbouncer.port), "-U", "postgres", "-n", "-S",
                             "-c", "2", "-R", "40", "-T", str(seconds), "app_ro"],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def pgbench_tables(pg_cluster: ChaosCluster) -> None:
    tool = str(pg_cluster.binaries.tool("pgbench"))
    subprocess.run([tool, "-i", "-s", "1", "-q", "-h", pg_cluster.primary.host, "-p", str(pg_cluster.primary.port),
                    "-U", "postgres", "postgres"], check=True, capture_output=True, timeout=120)
    pg_cluster.wait_replayed()


def test_eject_and_readmit_under_pgbench(pg_cluster: ChaosCluster, pgbouncer: PgBouncerServer,
                                         pgbench_tables: None, tmp_path: Path) -> None:
    r1, r2 = pg_cluster.replicas
    lw = Lagwatch(tmp_path, pool_config(pg_cluster, pgbouncer, tmp_path))
    bench_log = tmp_path / "pgbench.log"
    try:
        lw.wait_ready()
        bench = start_pgbench(pg_cluster, pgbouncer, 25, bench_log)
        lw.wait_cycles(2)
        assert read_addrs(pgbouncer) <= {r1.host, r2.host}
        r1.pause_replay()
        with Writer(pg_cluster) as writer:
            assert writer.first_write_at is not None
            # Staleness passes max_lag 2s after the first unreplayed write.
            crossed = writer.first_write_at + 2.0
            left = wait_hosts(pgbouncer, lambda hosts: r1.host not in hosts, timeout=15)
            assert left - crossed <= (2 + 1) * INTERVAL + 0.5, left - crossed
            assert read_addrs(pgbouncer) == {r2.host}
            lw.expect("lagwatch_pool_member", 0, replica="replica1")
            lw.expect("lagwatch_pool_changes_total", 1, replica="replica1", action="eject")
        r1.resume_replay()
        resumed = time.monotonic()
        back = wait_hosts(pgbouncer, lambda hosts: r1.host in hosts, timeout=20)
        # It must first be below readmit_below, then stay there for readmit_after (5) cycles.
        assert 4 * INTERVAL <= back - resumed <= (5 + 3) * INTERVAL, back - resumed
        assert app_ro_hosts(pgbouncer) == sorted([r1.host, r2.host])
        assert bench.wait(60) == 0, bench_log.read_text()
    finally:
        lw.stop()
    output = bench_log.read_text()
    processed = re.search(r"number of transactions actually processed: (\d+)", output)
    assert processed and int(processed.group(1)) > 500, output
    failed = re.search(r"number of failed transactions: (\d+)", output)
    assert failed is None or failed.group(1) == "0", output
    status = lw.log_text()
    assert re.search(r"pool change: cluster=main replica=replica1 action=eject reason='staleness", status)
    assert "action=readmit" in status


def test_millisecond_sla_ejects_and_readmits(pg_cluster: ChaosCluster, pgbouncer: PgBouncerServer,
                                            tmp_path: Path) -> None:
    """A 50 ms SLA at a 100 ms interval under 200 commits/s: replica1's apply delay goes
    10 ms -> 120 ms -> 10 ms. It is ejected after 3 bad cycles and readmitted after 5 good
    ones; replica2 (no delay) never changes."""
    r1, r2 = pg_cluster.replicas
    config = pool_config(pg_cluster, pgbouncer, tmp_path)
    config["interval"] = "100ms"
    config["clusters"][0]["sla"] = {"max_lag": "50ms", "eject_after": 3, "readmit_below": "25ms",
                                    "readmit_after": 5, "min_replicas": 1}
    with Lagwatch(tmp_path, config) as lw:
        lw.wait_ready()
        with LagOracle(pg_cluster, tmp_path / "writer", probes=False):
            r1.set_apply_delay(0.010)
            lw.wait_cycles(30)  # 3 s of 100 ms cycles at 10 ms: nobody ejected
            assert app_ro_hosts(pgbouncer) == sorted([r1.host, r2.host])
            r1.set_apply_delay(0.120)
            slowed = time.monotonic()
            left = wait_hosts(pgbouncer, lambda hosts: hosts == [r2.host], timeout=10)
            assert left - slowed <= 3.0, left - slowed
            p95 = lw.value("lagwatch_replica_lag_window_seconds", replica="replica1", quantile="0.95")
            assert p95 is not None and 0.05 < p95 < 0.2, p95
            lw.wait_cycles(20)
            assert app_ro_hosts(pgbouncer) == [r2.host]  # no flapping at a steady 120 ms
            r1.set_apply_delay(0.010)
            recovered = time.monotonic()
            back = wait_hosts(pgbouncer, lambda hosts: hosts == sorted([r1.host, r2.host]), timeout=10)
            assert back - recovered <= 3.0, back - recovered
            lw.wait_cycles(20)
            assert app_ro_hosts(pgbouncer) == sorted([r1.host, r2.host])
        lw.expect("lagwatch_pool_changes_total", 1, replica="replica1", action="eject")
        lw.expect("lagwatch_pool_changes_total", 1, replica="replica1", action="readmit")
        assert not lw.value("lagwatch_pool_changes_total", replica="replica2", action="eject")
        event = lw.status()["clusters"][0]["pool"]["events"][-1]
        assert event["action"] == "eject" and "max_lag 50ms" in event["reason"], event
        # The reason says why it was behind (diagnosis.py): the delay, not replay's capacity.
        assert "(apply_delay: recovery_min_apply_delay holds replay" in event["reason"], event


def test_a_rejected_reload_changes_nothing(pg_cluster: ChaosCluster, pgbouncer: PgBouncerServer,
                                           tmp_path: Path) -> None:
    """SIGHUP with bad configs while pool control runs: each is rejected whole. Targets,
    SLA, pooler and web config stay as they were (a scrape, an auth check and a pool
    change prove it) and the reload metric reads 0; then a good one applies fully."""
    import bcrypt
    import yaml

    r1, r2 = pg_cluster.replicas
    web = tmp_path / "web.yml"

    def web_config(password: str) -> str:
        return yaml.safe_dump({"basic_auth_users": {"prometheus": bcrypt.hashpw(password.encode(),
                                                                                  bcrypt.gensalt(4)).decode()}})

    web.write_text(web_config("old"))
    config = pool_config(pg_cluster, pgbouncer, tmp_path)
    config["web_config_file"] = str(web)
    lw = Lagwatch(tmp_path, config)
    lw.auth = ("prometheus", "old")
    try:
        lw.wait_ready()
        lw.wait_for("leadership", lambda: lw.value("lagwatch_leader") == 1, timeout=10)
        loaded_at = lw.daemon_value("lagwatch_config_last_reload_success_timestamp_seconds")
        cluster = config["clusters"][0]
        third = {"name": "replica3", "dsn": r2.dsn().replace(r2.host, "127.0.0.9")}
        bad_web = tmp_path / "bad-web.yml"
        bad_web.write_text("basic_auth_users: {prometheus: plain}\n")
        bad = {
            "interval NaN": {**config, "interval": float("nan")},
            "new SLA, and a bad one": {**config, "clusters": [{**cluster, "sla": {**cluster["sla"], "max_lag": "0s"}}]},
            "a new target, and a bad pooler option": {**config, "clusters": [{
                **cluster, "replicas": [*cluster["replicas"], third],
                "pooler": {**cluster["pooler"], "database": "ro\nx = y"}}]},
            "a new web config that does not load": {**config, "web_config_file": str(bad_web)},
            "a new pooler, and an unknown key": {**config, "bogus": 1, "clusters": [{
                **cluster, "pooler": {**cluster["pooler"], "database": "other_ro"}}]},
        }
        for what, data in bad.items():
            rejected = lw.log_text().count("reload rejected")
            lw.write_config(data)
            lw.signal(signal.SIGHUP)
            lw.wait_for(f"{what}: rejected", lambda rejected=rejected: lw.log_text().count("reload rejected")
                        > rejected, timeout=10)
        lw.wait_for("the reload metric at 0", lambda: lw.daemon_value("lagwatch_config_last_reload_successful") == 0,
                    timeout=5)
        assert lw.daemon_value("lagwatch_config_last_reload_success_timestamp_seconds") == loaded_at
        # Targets and SLA as before; the old password still opens, nothing else does.
        samples = lw.samples()
        assert {dict(labels)["node"] for (name, labels) in samples if name == "lagwatch_up"} == {
            "primary", "replica1", "replica2"}
        assert lw.value("lagwatch_replica_sla_max_lag_seconds", replica="replica1") == 2.0
        lw.auth = None
        assert lw.get("/metrics")[0] == 401
        lw.auth = ("prometheus", "old")
        # The pooler in force still moves the pool (app_ro, not other_ro).
        r1.pause_replay()
        with Writer(pg_cluster):
            wait_hosts(pgbouncer, lambda hosts: hosts == [r2.host], timeout=15)
        r1.resume_replay()
        wait_hosts(pgbouncer, lambda hosts: hosts == sorted([r1.host, r2.host]), timeout=20)

        # A good config applies whole: new SLA, new password.
        web.write_text(web_config("new"))
        lw.write_config({**config, "clusters": [{**cluster, "sla": {**cluster["sla"], "max_lag": "5s"}}]})
        lw.signal(signal.SIGHUP)
        lw.auth = ("prometheus", "new")
        lw.wait_for("the reload metric at 1", lambda: lw.get("/metrics")[0] == 200 and lw.daemon_value(
            "lagwatch_config_last_reload_successful") == 1, timeout=10)
        assert (lw.daemon_value("lagwatch_config_last_reload_success_timestamp_seconds") or 0) > (loaded_at or 0)
        assert lw.value("lagwatch_replica_sla_max_lag_seconds", replica="replica1") == 5.0
        lw.auth = ("prometheus", "old")
        assert lw.get("/metrics")[0] == 401
        assert "Traceback" not in lw.log_text()
    finally:
        lw.stop()


def test_both_paused_min_replicas_keeps_least_behind(pg_cluster: ChaosCluster, pgbouncer: PgBouncerServer,
                                                     tmp_path: Path) -> None:
    r1, r2 = pg_cluster.replicas
    with Lagwatch(tmp_path, pool_config(pg_cluster, pgbouncer, tmp_path)) as lw:
        lw.wait_ready()
        with Writer(pg_cluster):
            r2.pause_replay()
            let_time_pass(3)  # replica2 3 s more behind than replica1 will be
            r1.pause_replay()  # r1 stops later: it is the less behind of the two
            wait_hosts(pgbouncer, lambda hosts: hosts == [r1.host], timeout=15)
            lw.wait_cycles(4)
            assert app_ro_hosts(pgbouncer) == [r1.host]
        assert lw.value("lagwatch_pool_member", replica="replica1") == 1
        assert "min_replicas" in lw.status()["clusters"][0]["pool"]["reasons"]["replica1"]


def test_both_paused_fallback_to_primary(pg_cluster: ChaosCluster, pgbouncer: PgBouncerServer,
                                         tmp_path: Path) -> None:
    with Lagwatch(tmp_path, pool_config(pg_cluster, pgbouncer, tmp_path, fallback_to_primary=True)) as lw:
        lw.wait_ready()
        with Writer(pg_cluster):
            pause_both_until_the_primary_serves(pg_cluster, pgbouncer)
            assert read_addrs(pgbouncer, 3) == {pg_cluster.primary.host}
            lw.expect("lagwatch_pool_member", 1, replica="primary")
        resume_both_until_both_serve(pg_cluster, pgbouncer)
        lw.expect("lagwatch_pool_changes_total", 1, replica="primary", action="remove")
        lw.expect("lagwatch_pool_member", 0, replica="primary")  # out again, not absent


def test_all_ejected_with_min_replicas_0_points_at_primary_once(pg_cluster: ChaosCluster,
                                                                pgbouncer: PgBouncerServer, tmp_path: Path) -> None:
    """With no replica left, the entry points at the primary (never an empty host=), and
    that is applied once: the pool PgBouncer reports then is what lagwatch asked for."""
    with Lagwatch(tmp_path, pool_config(pg_cluster, pgbouncer, tmp_path, min_replicas=0)) as lw:
        lw.wait_ready()
        with Writer(pg_cluster):
            pause_both_until_the_primary_serves(pg_cluster, pgbouncer)
            cycles = lw.daemon_value("lagwatch_cycles_total") or 0
            lw.wait_for("5 more cycles", lambda: (lw.daemon_value("lagwatch_cycles_total") or 0) >= cycles + 5,
                        timeout=15)
            assert lw.log_text().count("pgbouncer pool is now primary") == 1
            assert lw.value("lagwatch_pool_apply_errors_total") == 0
        resume_both_until_both_serve(pg_cluster, pgbouncer)


def test_reload_keeps_pool_state_and_leadership(pg_cluster: ChaosCluster, pgbouncer: PgBouncerServer,
                                                tmp_path: Path) -> None:
    """SIGHUP with a changed SLA: counters, events and the leader lock carry over; the
    ejected replica stays out until it earns its way back under the new SLA."""
    r1, r2 = pg_cluster.replicas
    config = pool_config(pg_cluster, pgbouncer, tmp_path)
    lw = Lagwatch(tmp_path, config)
    try:
        lw.wait_ready()
        lw.wait_for("leadership", lambda: lw.value("lagwatch_leader") == 1, timeout=10)
        r1.pause_replay()
        with Writer(pg_cluster):
            wait_hosts(pgbouncer, lambda hosts: hosts == [r2.host], timeout=15)
            config["clusters"][0]["sla"]["readmit_after"] = 3
            lw.write_config(config)
            lw.signal(signal.SIGHUP)
            lw.wait_for("the reload", lambda: "reloaded " in lw.log_text(), timeout=10)
            cycles = lw.daemon_value("lagwatch_cycles_total") or 0
            lw.wait_for("3 more cycles", lambda: (lw.daemon_value("lagwatch_cycles_total") or 0) >= cycles + 3,
                        timeout=15)
            assert app_ro_hosts(pgbouncer) == [r2.host]
            assert lw.value("lagwatch_pool_changes_total", replica="replica1", action="eject") == 1
            assert lw.value("lagwatch_leader") == 1
            events = lw.status()["clusters"][0]["pool"]["events"]
            assert [(e["member"], e["action"]) for e in events] == [("replica1", "eject")]
        r1.resume_replay()
        wait_hosts(pgbouncer, lambda hosts: hosts == sorted([r1.host, r2.host]), timeout=20)
    finally:
        lw.stop()
    log = lw.log_text()
    assert log.count("this instance is now the leader") == 1
    assert "no longer the leader" not in log.split("reloaded ", 1)[1].split("stopping", 1)[0]
    assert "readmit" in log and "below 1s for 3 cycle(s)" in log


def test_stopped_replica_ejected_and_readmitted(pg_cluster: ChaosCluster, pgbouncer: PgBouncerServer,
                                                tmp_path: Path) -> None:
    r1, r2 = pg_cluster.replicas
    with Lagwatch(tmp_path, pool_config(pg_cluster, pgbouncer, tmp_path)) as lw:
        lw.wait_ready()
        r2.stop()
        wait_hosts(pgbouncer, lambda hosts: hosts == [r1.host], timeout=10)
        r2.start()
        wait_hosts(pgbouncer, lambda hosts: r2.host in hosts, timeout=20)
        assert "unreachable" in lw.log_text()


def test_apply_delay_near_threshold_does_not_flap(pg_cluster: ChaosCluster, pgbouncer: PgBouncerServer,
                                                  tmp_path: Path) -> None:
    r1 = pg_cluster.replicas[0]
    with Lagwatch(tmp_path, pool_config(pg_cluster, pgbouncer, tmp_path)) as lw:
        lw.wait_ready()
        # A steady stream of commits (20/s), applied 1.8 s and 2.2 s late by turns, 3 s
        # each: staleness crosses max_lag (2s) one way and back every few cycles. (A
        # sparse stream against fixed delay would not do: its phase can lock to the polls
        # and sit on one side.)
        readings = []
        with Writer(pg_cluster, every=0.05, max_seconds=40):
            for second in range(24):
                if second % 3 == 0:
                    r1.set_apply_delay(2.2 if second % 6 == 0 else 1.8)
                lw.wait_cycles(1)
                readings.append(lw.value("lagwatch_replica_lag_seconds", replica="replica1"))
        changes = sum(v for (name, labels), v in lw.samples().items()
                      if name == "lagwatch_pool_changes_total" and ("replica", "replica1") in labels)
        assert changes <= 2, changes  # at most one eject and one readmit in 24 cycles
        # ... while its staleness was on both sides of max_lag (2s), again and again.
        above = sum(1 for r in readings if r is not None and r > 2.0)
        below = sum(1 for r in readings if r is not None and 0.5 < r <= 2.0)
        assert above >= 3 and below >= 3, readings


def test_dry_run_changes_nothing(pg_cluster: ChaosCluster, pgbouncer: PgBouncerServer, tmp_path: Path) -> None:
    r1 = pg_cluster.replicas[0]
    before_file = pgbouncer.include_file.read_bytes()
    before_stat = pgbouncer.include_file.stat()
    before_db = pgbouncer.show_databases()["app_ro"]["host"]
    with Lagwatch(tmp_path, pool_config(pg_cluster, pgbouncer, tmp_path, dry_run=True)) as lw:
        lw.wait_ready()
        r1.pause_replay()
        with Writer(pg_cluster):
            lw.wait_for("a dry-run eject", lambda: lw.value("lagwatch_pool_changes_total", replica="replica1",
                                                           action="eject") == 1, timeout=15)
        assert "(dry run, not applied)" in lw.log_text()
        assert lw.value("lagwatch_pool_dry_run") == 1
    assert pgbouncer.include_file.read_bytes() == before_file
    after_stat = pgbouncer.include_file.stat()
    assert (after_stat.st_ino, after_stat.st_mtime_ns) == (before_stat.st_ino, before_stat.st_mtime_ns)
    assert pgbouncer.show_databases()["app_ro"]["host"] == before_db


def test_pgbouncer_down_during_change(pg_cluster: ChaosCluster, pgbouncer: PgBouncerServer, tmp_path: Path) -> None:
    r1, r2 = pg_cluster.replicas
    old = pgbouncer.include_file.read_text()
    lw = Lagwatch(tmp_path, pool_config(pg_cluster, pgbouncer, tmp_path))
    try:
        lw.wait_ready()
        pgbouncer.stop()
        r1.pause_replay()
        with Writer(pg_cluster):
            lw.wait_for("apply errors", lambda: (lw.value("lagwatch_pool_apply_errors_total") or 0) >= 1, timeout=20)
            # RELOAD never reached PgBouncer, so the file it would start from is the old one:
            # whole, never partial, and put back after each failed attempt.
            lw.wait_for("a retry", lambda: (lw.value("lagwatch_pool_apply_errors_total") or 0) >= 2, timeout=20)
            for _ in range(20):
                assert pgbouncer.include_file.read_text() == old
                time.sleep(0.1)
            assert lw.proc.poll() is None
            pgbouncer.start()
            wait_hosts(pgbouncer, lambda hosts: hosts == [r2.host], timeout=40)
    finally:
        lw.stop()
    assert "PgBouncer admin console" in lw.log_text()
    # Once PgBouncer answers again the pending change goes out at once, not after the backoff.
    assert "pgbouncer answers again; applying without waiting" in lw.log_text()
    assert pgbouncer.include_file.read_text().endswith(f"app_ro = host={r2.host} port={r2.port} dbname=postgres\n")


def test_two_instances_one_leader(pg_cluster: ChaosCluster, pgbouncer: PgBouncerServer, tmp_path: Path) -> None:
    r1, r2 = pg_cluster.replicas
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = Lagwatch(tmp_path / "a", pool_config(pg_cluster, pgbouncer, tmp_path / "a"))
    first.wait_ready()
    first.wait_for("first leads", lambda: first.value("lagwatch_leader") == 1, timeout=10)
    second = Lagwatch(tmp_path / "b", pool_config(pg_cluster, pgbouncer, tmp_path / "b"))
    try:
        second.wait_ready()
        second.wait_cycles(3)
        assert first.value("lagwatch_leader") == 1 and second.value("lagwatch_leader") == 0
        # Both export metrics.
        assert second.value("lagwatch_replica_lag_seconds", replica="replica1") is not None
        r1.pause_replay()
        with Writer(pg_cluster):
            wait_hosts(pgbouncer, lambda hosts: hosts == [r2.host], timeout=15)
        # Both decided; only the leader applied (and logged the apply).
        first.wait_logged("pgbouncer pool is now")
        assert "pgbouncer pool is now" not in second.log_text()
        r1.resume_replay()
        first.proc.send_signal(signal.SIGKILL)  # the leader dies without a goodbye
        first.proc.wait(5)
        second.wait_for("second leads", lambda: second.value("lagwatch_leader") == 1, timeout=5 * INTERVAL)
        wait_hosts(pgbouncer, lambda hosts: hosts == sorted([r1.host, r2.host]), timeout=20)
        second.wait_logged("pgbouncer pool is now")
    finally:
        first.stop()
        second.stop()


def test_hold_beats_automation_and_survives_restart(pg_cluster: ChaosCluster, pgbouncer: PgBouncerServer,
                                                     tmp_path: Path) -> None:
    r1, r2 = pg_cluster.replicas
    with Lagwatch(tmp_path, pool_config(pg_cluster, pgbouncer, tmp_path)) as lw:
        lw.wait_ready()
        result = run_cli("pool", "-c", str(lw.config_path), "hold", "replica2", "out")
        assert result.returncode == 0, result.stderr
        wait_hosts(pgbouncer, lambda hosts: hosts == [r1.host], timeout=10)
    with Lagwatch(tmp_path, pool_config(pg_cluster, pgbouncer, tmp_path)) as lw:
        lw.wait_ready()
        lw.wait_cycles(3)
        assert app_ro_hosts(pgbouncer) == [r1.host]
        assert lw.value("lagwatch_pool_held", replica="replica2", hold="out") == 1
        shown = run_cli("pool", "-c", str(lw.config_path), "show")
        assert "replica2" in shown.stdout and "pgbouncer pool: replica1" in shown.stdout
        assert run_cli("pool", "-c", str(lw.config_path), "release", "replica2").returncode == 0
        wait_hosts(pgbouncer, lambda hosts: hosts == sorted([r1.host, r2.host]), timeout=20)

