"""Pool control through a real PgBouncer (transaction pooling) in front of real replicas.

One PostgreSQL major (``one_pg_version``): what is tested is lagwatch's decisions and
PgBouncer's pool, which do not depend on the server's version (the views that read
staleness are tested on every major elsewhere).

Lagwatch polls every 200 ms here, and the SLA is scaled to it (max_lag 500 ms, readmit
below 250 ms; a healthy replica here reads a few milliseconds at most, busy host or not):
eject_after and readmit_after are counted in cycles, so a replica's way out and back in
takes a second or two of the product's cycles rather than ten of the clock. When
a test needs to know that something happened soon enough, it counts lagwatch's cycles in
lagwatch's own log (pool_timeline.py); when it watches something stay steady, it watches
it for a number of cycles.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from chaoscluster import ChaosCluster
from harness import Lagwatch, Writer, cluster_config, run_cli
from lagwatch.act.leader import LOCK_CLASS
from lagwatch.demo.ports import free_port
from loads import PoolReads, create_read_table
from oracle import LagOracle
from pgbouncer_server import PgBouncerServer, read_pool_for, readable_by_servers
from pool_timeline import CycleLog, above, below

INTERVAL = "200ms"
MAX_LAG = 0.5
READMIT_BELOW = 0.25


pytestmark = pytest.mark.one_pg_version

SLA = {"max_lag": "500ms", "eject_after": 2, "readmit_below": "250ms", "readmit_after": 5, "min_replicas": 1}


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
    config = cluster_config(cluster, free_port(["127.0.0.1"]), interval=INTERVAL, window="1m",
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


def wait_hosts(pgbouncer: PgBouncerServer, predicate: Any, timeout: float) -> None:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate(app_ro_hosts(pgbouncer)):
            return
        time.sleep(0.05)
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


@pytest.fixture(scope="module")
def read_table(pg_cluster: ChaosCluster) -> str:
    return create_read_table(pg_cluster)


def test_eject_and_readmit_under_pgbench(pg_cluster: ChaosCluster, pgbouncer: PgBouncerServer,
                                         read_table: str, tmp_path: Path) -> None:
    """replica1 falls behind and is ejected after eject_after cycles over max_lag, then is
    readmitted after readmit_after cycles below readmit_below, while pgbench's clients
    read through PgBouncer from before the first change to after the last, without an
    error."""
    r1, r2 = pg_cluster.replicas
    bench = PoolReads(pg_cluster, pgbouncer, read_table, tmp_path)
    lw = Lagwatch(tmp_path, pool_config(pg_cluster, pgbouncer, tmp_path))
    try:
        lw.wait_ready()
        bench.wait_reads_after(-1)  # reading through both replicas
        lw.wait_cycles(2)
        assert read_addrs(pgbouncer) <= {r1.host, r2.host}
        paused = lw.cycles()
        r1.pause_replay()
        with Writer(pg_cluster):
            wait_hosts(pgbouncer, lambda hosts: r1.host not in hosts, timeout=15)
            assert read_addrs(pgbouncer) == {r2.host}
            lw.expect("lagwatch_pool_member", 0, replica="replica1")
            lw.expect("lagwatch_pool_changes_total", 1, replica="replica1", action="eject")
        resumed = lw.cycles()
        r1.resume_replay()
        wait_hosts(pgbouncer, lambda hosts: r1.host in hosts, timeout=20)
        assert app_ro_hosts(pgbouncer) == sorted([r1.host, r2.host])
        # pgbench's clients (each on one connection since the start) read on after both changes.
        bench.wait_reads_after(len(bench.progress()))
        output = bench.stop()
        timeline = CycleLog.of(lw)
    finally:
        bench.kill()
        lw.stop()
    assert not re.search(r"error|abort|fatal", output, re.I), output
    assert bench.progress() and all(failed == 0 for _, failed in bench.progress()), output
    # Out on the eject_after-th cycle over max_lag, back on the readmit_after-th below
    # readmit_below: neither sooner (hysteresis) nor later (pool_timeline.py).
    ejected = timeline.assert_acted_after_streak("replica1", "eject", paused, above(MAX_LAG), SLA["eject_after"])
    assert timeline.change("replica1", "eject", paused)[1].startswith("'staleness"), timeline.change(
        "replica1", "eject", paused)
    assert ejected <= resumed
    timeline.assert_acted_after_streak("replica1", "readmit", resumed, below(READMIT_BELOW), SLA["readmit_after"])


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
            slowed = lw.cycles()
            r1.set_apply_delay(0.120)
            wait_hosts(pgbouncer, lambda hosts: hosts == [r2.host], timeout=10)
            p95 = lw.value("lagwatch_replica_lag_window_seconds", replica="replica1", quantile="0.95")
            assert p95 is not None and 0.05 < p95 < 0.2, p95
            lw.wait_cycles(20)
            assert app_ro_hosts(pgbouncer) == [r2.host]  # no flapping at a steady 120 ms
            recovered = lw.cycles()
            r1.set_apply_delay(0.010)
            wait_hosts(pgbouncer, lambda hosts: hosts == sorted([r1.host, r2.host]), timeout=10)
            lw.wait_cycles(20)
            assert app_ro_hosts(pgbouncer) == sorted([r1.host, r2.host])
        lw.expect("lagwatch_pool_changes_total", 1, replica="replica1", action="eject")
        lw.expect("lagwatch_pool_changes_total", 1, replica="replica1", action="readmit")
        # Out on the 3rd cycle over 50 ms, back on the 5th under 25 ms, neither sooner nor
        # later (pool_timeline.py); each streak begun within 10 fresh cycles of the delay's
        # change (1 s at 100 ms: the replica takes the new delay at its reload, replay shows
        # it within 40 ms, and what is left is room for a busy host to be late).
        timeline = CycleLog.of(lw)
        ejected = timeline.assert_acted_after_streak("replica1", "eject", slowed, above(0.050), 3)
        assert timeline.fresh(slowed + 1, ejected) <= 10 + 3, timeline.excerpt("replica1", slowed, ejected)
        back = timeline.assert_acted_after_streak("replica1", "readmit", recovered, below(0.025), 5)
        assert timeline.fresh(recovered + 1, back) <= 10 + 5, timeline.excerpt("replica1", recovered, back)
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
        assert lw.value("lagwatch_replica_sla_max_lag_seconds", replica="replica1") == MAX_LAG
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
    """replica2 stops replaying and is ejected; then replica1 stops too, later, so it is
    the less behind of the two: it goes over max_lag for good and stays, kept to honour
    min_replicas 1, and the pool never moves."""
    r1, r2 = pg_cluster.replicas
    with Lagwatch(tmp_path, pool_config(pg_cluster, pgbouncer, tmp_path)) as lw:
        lw.wait_ready()
        with Writer(pg_cluster):
            r2.pause_replay()
            wait_hosts(pgbouncer, lambda hosts: hosts == [r1.host], timeout=15)
            r1.pause_replay()  # r1 stops later: it is the less behind of the two
            lw.wait_for("replica1 kept to honour min_replicas", lambda: "min_replicas" in lw.status()[
                "clusters"][0]["pool"]["reasons"]["replica1"], timeout=15)
            lw.wait_cycles(5)  # both behind, and still nothing moves
            assert app_ro_hosts(pgbouncer) == [r1.host]
            assert "min_replicas" in lw.status()["clusters"][0]["pool"]["reasons"]["replica1"]
        assert lw.value("lagwatch_pool_member", replica="replica1") == 1
        assert lw.value("lagwatch_pool_changes_total", replica="replica2", action="eject") == 1
        assert not lw.value("lagwatch_pool_changes_total", replica="replica1", action="eject")


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
            lw.wait_cycles(5)  # all ejected, and nothing applied again
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
            lw.wait_cycles(3)  # the reloaded config in force: still out, still leader
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
    assert "readmit" in log and "below 250ms for 3 cycle(s)" in log


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
    # An SLA of a second: the delays below are long beside the 50 ms between commits.
    config = pool_config(pg_cluster, pgbouncer, tmp_path, max_lag="1s", readmit_below="500ms")
    with Lagwatch(tmp_path, config) as lw:
        lw.wait_ready()
        # A steady stream of commits (20/s), applied 1.1 s and 0.9 s late by turns, 3
        # cycles each (the way up takes one 200 ms cycle, as 2.2 s and 1.8 s took one
        # 1 s cycle): staleness crosses max_lag (1s) one way and back every few cycles,
        # never below readmit_below (500ms) once the delay has filled. (A sparse stream
        # against fixed delay would not do: its phase can lock to the polls and sit on
        # one side.)
        readings = []
        with Writer(pg_cluster, every=0.05, max_seconds=60):
            for cycle in range(24):
                if cycle % 3 == 0:
                    r1.set_apply_delay(1.1 if cycle % 6 == 0 else 0.9)
                lw.wait_cycles(1)
                readings.append(lw.value("lagwatch_replica_lag_seconds", replica="replica1"))
        changes = sum(v for (name, labels), v in lw.samples().items()
                      if name == "lagwatch_pool_changes_total" and ("replica", "replica1") in labels)
        assert changes <= 2, changes  # at most one eject and one readmit in 24 cycles
        # ... while its staleness was on both sides of max_lag, again and again.
        above_max = sum(1 for r in readings if r is not None and r > 1.0)
        below_max = sum(1 for r in readings if r is not None and 0.5 < r <= 1.0)
        assert above_max >= 3 and below_max >= 3, readings


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


class FileWatch:
    """Reads a file every millisecond in a background thread: each content it showed, in
    order (a content that stays is kept once)."""

    def __init__(self, path: Path) -> None:
        import threading

        self.path = path
        self.seen: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            try:
                text = self.path.read_text()
            except OSError as exc:  # never missing while it is replaced (a rename): a finding
                text = f"<unreadable: {exc}>"
            if not self.seen or self.seen[-1] != text:
                self.seen.append(text)

    def __enter__(self) -> FileWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_pgbouncer_down_during_change(pg_cluster: ChaosCluster, pgbouncer: PgBouncerServer, tmp_path: Path) -> None:
    r1, r2 = pg_cluster.replicas
    old = pgbouncer.include_file.read_text()
    lw = Lagwatch(tmp_path, pool_config(pg_cluster, pgbouncer, tmp_path))
    try:
        lw.wait_ready()
        pgbouncer.stop()
        r1.pause_replay()
        with Writer(pg_cluster):
            with FileWatch(pgbouncer.include_file) as watch:
                lw.wait_for("three failed attempts",
                            lambda: (lw.value("lagwatch_pool_apply_errors_total") or 0) >= 3, timeout=20)
            assert lw.proc.poll() is None
            pgbouncer.start()  # just after a failed attempt: the next is 0.8 s (a backoff) away
            wait_hosts(pgbouncer, lambda hosts: hosts == [r2.host], timeout=40)
    finally:
        lw.stop()
    assert "PgBouncer admin console" in lw.log_text()
    new = pgbouncer.include_file.read_text()
    assert new.endswith(f"app_ro = host={r2.host} port={r2.port} dbname=postgres\n")
    # While RELOAD could not reach PgBouncer, the file it would start from was the old one
    # but for the moment of each attempt (the new file is written, then RELOAD is tried),
    # whole, never partial, and put back after each failed attempt: only ever the old
    # file, or the new one followed by the old (but the last, which may have been under way).
    assert watch.seen[0] == old and set(watch.seen) <= {old, new}, watch.seen
    # Once PgBouncer answers again the pending change goes out at once, not after the
    # backoff: in the very cycle that found it answering.
    timeline = CycleLog(lw.log_text())
    answering = timeline.cycle_of("pgbouncer answers again; applying without waiting")
    assert timeline.cycle_of("pgbouncer pool is now replica2", answering - 1) == answering


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
        second.wait_logged("replica=replica1 action=eject")
        decided = next(line for line in second.log_text().splitlines() if "replica=replica1 action=eject" in line)
        assert "(not applied here: the leader, another lagwatch instance, applies it" in decided, decided
        assert "pgbouncer pool is now" not in second.log_text()
        r1.resume_replay()
        holder = first.status()["clusters"][0]["pool"]["leader_holder"]
        assert holder["this_instance"], holder
        first.proc.send_signal(signal.SIGKILL)  # the leader dies without a goodbye
        first.proc.wait(5)
        # The server lets the lock go when it sees the session's end; from then on the
        # second takes it in the first cycle that asks: the cycle under way may have asked
        # before (1), the next asks after (2), and its answer may come back after that
        # cycle stopped waiting, for the one after to take (3).
        wait_lock_released(pg_cluster, int(holder["pid"]))
        asked = second.cycles()
        second.wait_for("second leads", lambda: second.value("lagwatch_leader") == 1, timeout=15)
        led = CycleLog(second.log_text()).cycle_of("this instance is now the leader")
        assert led <= asked + 3, (asked, led)
        wait_hosts(pgbouncer, lambda hosts: hosts == sorted([r1.host, r2.host]), timeout=20)
        second.wait_logged("pgbouncer pool is now")
    finally:
        first.stop()
        second.stop()
    assert first.log_text().count("this instance is now the leader") == 1
    assert second.log_text().count("this instance is now the leader") == 1


def wait_lock_released(cluster: ChaosCluster, pid: int, timeout: float = 15) -> None:
    """Wait until the server holds no lagwatch leader lock for session ``pid`` any more."""
    deadline = time.monotonic() + timeout
    while cluster.primary.execute("SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted "
                                  "AND classid = %s::oid AND pid = %s", (LOCK_CLASS, pid)):
        assert time.monotonic() < deadline, f"session {pid} still holds its leader lock after {timeout}s"
        time.sleep(0.02)


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



def test_the_cycle_log_counts_the_cycles_that_logged_no_line_while_connecting() -> None:
    """On a busy host the first cycle ended before any connection was made: it logged no
    cycle line, and the first line is cycle 2, which the line saying every node answered
    names. Counted from the first line, every cycle was one short of
    lagwatch_cycles_total, and a readmit after a streak of 5 read as one after 4."""
    log = "\n".join([
        "2026-11-29 02:14:41,914 INFO lagwatch.daemon: first cycle: 0 of 3 node(s) answered; 3 still connecting",
        "2026-11-29 02:14:42,072 INFO lagwatch.daemon: every node has answered or failed once, 379ms after start "
        "(cycle 2)",
        "2026-11-29 02:14:42,072 INFO lagwatch.daemon: main: replica1=0ms (p95 0ms), replica2=0ms (p95 0ms)",
        "2026-11-29 02:14:42,140 WARNING lagwatch.pool: pool change: cluster=main replica=replica1 action=eject "
        "reason='staleness 814ms > max_lag 500ms for 2 cycle(s)' staleness=814ms p95=814ms",
        "2026-11-29 02:14:42,141 INFO lagwatch.daemon: main: replica1=814ms (p95 814ms) REPLAY-PAUSED, "
        "replica2=0ms (p95 0ms)",
    ])
    timeline = CycleLog(log)
    assert [c.number for c in timeline.cycles] == [1, 2, 3]
    assert timeline.cycles[0].replicas == {}  # the cycle that logged no line
    assert timeline.cycles[1].replicas["replica1"].staleness == 0.0
    assert timeline.change("replica1", "eject") == (3, "'staleness 814ms > max_lag 500ms for 2 cycle(s)'")
