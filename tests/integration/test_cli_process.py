"""The CLI as an operator uses it: signals, reloads, check, unconfigured replicas, secrets.

None of it depends on the PostgreSQL version (the lag truth and least-privilege tests run
the daemon on both): one version runs these.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import yaml
from chaoscluster import ChaosCluster
from harness import Lagwatch, Writer, cluster_config, let_time_pass, run_cli
from lagwatch.demo.ports import free_port
from lagwatch.demo.servers import wait_until

pytestmark = pytest.mark.one_pg_version

SECRET = "Sup3r-Secret-Pw"


def test_sigterm_exits_cleanly(pg_cluster: ChaosCluster, tmp_path: Path) -> None:
    """SIGTERM ends it: exit code 0, no traceback, its sessions gone. How long that takes is
    a speed, measured by bench/shutdown.py (docs/benchmarks.md), not asserted here: the wait
    below only keeps a hang from hanging the suite."""
    lw = Lagwatch.for_cluster(tmp_path, pg_cluster)
    lw.wait_ready()
    lw.wait_cycles(2)
    lw.signal(signal.SIGTERM)
    assert lw.proc.wait(30) == 0, lw.log_text()[-3000:]
    assert "Traceback" not in lw.log_text()
    # Its sessions end as the server sees their sockets close (a moment after the exit).
    assert wait_until(lambda: pg_cluster.primary.scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'lagwatch/%'") == 0, 10)


class BlackHole:
    """A TCP server on loopback that accepts every connection and never says a word: a node
    whose connection attempt hangs until lagwatch's deadline."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_sigterm_in_the_middle_of_a_cycle_exits_0_with_only_the_stop_line(pg_cluster: ChaosCluster,
                                                                          tmp_path: Path) -> None:
    """The first cycle waits its whole budget (1.6 s) on a node that never answers; SIGTERM
    comes in the middle of it. The cycle ends (applying nothing), lagwatch exits 0, and
    after the signal its output holds the stop line and nothing else."""
    hole = BlackHole()
    config = cluster_config(pg_cluster, free_port(["127.0.0.1"]), interval="2s", state_dir=str(tmp_path / "state"))
    config["clusters"][0]["replicas"].append(
        {"name": "hole", "dsn": f"host=127.0.0.1 port={hole.port} user=postgres dbname=postgres"})
    config["clusters"][0]["pooler"] = {"kind": "command", "template": "{members}\n",
                                       "output_file": str(tmp_path / "pool.txt"), "reload_command": ["true"]}
    try:
        with Lagwatch(tmp_path, config, log_level="info") as lw:
            lw.wait_for("the HTTP server", lambda: _answers(lw, "/healthz"), 10)
            time.sleep(0.4)  # the first cycle is under way: connecting to the hole, for 1.6 s
            assert lw.get("/readyz")[0] == 503  # still in it
            before = len(lw.log_text())
            lw.signal(signal.SIGTERM)
            assert lw.proc.wait(10) == 0
            after = lw.log_text()[before:]
            assert [line.split(" ", 2)[-1] for line in after.splitlines()] == ["INFO lagwatch.daemon: stopping"], after
            assert "Traceback" not in lw.log_text() and "CancelledError" not in lw.log_text()
            assert not (tmp_path / "pool.txt").exists()  # the pool as it was: never written
    finally:
        hole.close()


def _answers(lw: Lagwatch, path: str) -> bool:
    try:
        lw.get(path)
    except OSError:
        return False
    return True


def test_sighup_reload_good_and_bad(pg_cluster: ChaosCluster, tmp_path: Path) -> None:
    port = free_port(["127.0.0.1"])
    lw = Lagwatch(tmp_path, cluster_config(pg_cluster, port, replicas=["replica1"]))
    try:
        lw.wait_ready()
        # replica2 streams from the primary but is not configured: it still shows up,
        # with the primary-side signals.
        lw.wait_for("unconfigured replica2", lambda: lw.value("lagwatch_replica_configured",
                                                                replica="replica2") == 0, timeout=10)
        assert lw.value("lagwatch_replica_lag_bytes", replica="replica2", stage="replay") is not None
        assert lw.value("lagwatch_replica_lag_seconds", replica="replica2") is not None
        assert lw.value("lagwatch_up", node="replica2") is None

        # A bad config on SIGHUP: rejected with a log line, old config still running.
        lw.config_path.write_text("interval: -1s\nclusters: []\n")
        lw.signal(signal.SIGHUP)
        lw.wait_for("reload rejected", lambda: "reload rejected" in lw.log_text(), timeout=10)
        assert "interval: must not be negative" in lw.log_text()
        lw.wait_cycles(2)  # the old config keeps running
        assert lw.proc.poll() is None
        assert lw.value("lagwatch_up", node="replica1") == 1

        # A good one: replica2 becomes a configured, polled node.
        lw.write_config(cluster_config(pg_cluster, port))
        lw.signal(signal.SIGHUP)
        lw.wait_for("replica2 polled", lambda: lw.value("lagwatch_up", node="replica2") == 1, timeout=10)
        assert lw.value("lagwatch_replica_configured", replica="replica2") == 1
    finally:
        assert lw.stop() == 0


def test_check_exit_codes(pg_cluster: ChaosCluster, tmp_path: Path) -> None:
    config = tmp_path / "lagwatch.yaml"
    config.write_text(yaml.safe_dump(cluster_config(pg_cluster, free_port(["127.0.0.1"]))))
    ok = run_cli("check", "-c", str(config))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.startswith("LAGWATCH OK") and "replica1" in ok.stdout and "replica2" in ok.stdout

    # replica2 streams from the primary but is not in this config: nothing is wrong with it.
    only_one = tmp_path / "one.yaml"
    only_one.write_text(yaml.safe_dump(cluster_config(pg_cluster, free_port(["127.0.0.1"]), replicas=["replica1"])))
    seen = run_cli("check", "-c", str(only_one))
    assert seen.returncode == 0, seen.stdout + seen.stderr

    pg_cluster.replicas[1].stop()
    down = run_cli("check", "-c", str(config))
    assert down.returncode == 2, down.stdout
    assert "replica2" in down.stdout and "CRITICAL" in down.stdout

    pg_cluster.replicas[1].start()
    pg_cluster.replicas[0].pause_replay()
    with Writer(pg_cluster):
        let_time_pass(3)  # replica1 past the 1s warning, by the clock
        warn = run_cli("check", "-c", str(config), "--warning", "1s", "--critical", "1h")
    assert warn.returncode == 1, warn.stdout
    assert "replica1" in warn.stdout and "replay paused" in warn.stdout

    config.write_text("clusters: nope\n")
    bad = run_cli("check", "-c", str(config))
    assert bad.returncode == 2 and "clusters" in bad.stderr


def test_no_password_anywhere(pg_cluster: ChaosCluster, tmp_path: Path) -> None:
    """Passwords in a DSN, a password_file and an env var never show up in logs, HTTP
    responses, CLI output or error messages, including connection errors."""
    pw_file = tmp_path / "pw"
    pw_file.write_text(SECRET + "-file\n")
    port = free_port(["127.0.0.1"])
    config = cluster_config(pg_cluster, port)
    cluster = config["clusters"][0]
    cluster["primary"]["dsn"] += f" password={SECRET}-dsn"
    cluster["replicas"][0]["password_file"] = str(pw_file)
    cluster["replicas"][1]["password_env"] = "LW_TEST_PW"
    # Pool control through a PgBouncer admin console that is not there: its errors (read
    # and apply) are logged and shown on /status and /api/status.
    dead = free_port(["127.0.0.1"])
    cluster["sla"] = {"eject_after": 1, "max_lag": "1s", "min_replicas": 0}
    cluster["pooler"] = {"kind": "pgbouncer", "include_file": str(tmp_path / "replicas.ini"),
                         "admin_dsn": f"host=127.0.0.1 port={dead} user=pgbouncer dbname=pgbouncer "
                                      f"password={SECRET}-admin",
                         "database": "app_ro", "options": f"port={pg_cluster.replicas[0].port} dbname=postgres"}
    env = {"LW_TEST_PW": SECRET + "-env"}
    lw = Lagwatch(tmp_path, config, env=env)
    try:
        lw.wait_ready()
        pg_cluster.replicas[1].stop()  # connection errors get logged and exported
        lw.wait_for("replica2 down", lambda: lw.value("lagwatch_up", node="replica2") == 0, timeout=10)
        lw.wait_for("a failed pooler apply", lambda: (lw.value("lagwatch_pool_apply_errors_total") or 0) >= 1,
                    timeout=15)
        lw.wait_cycles(2)  # the failures are on every page by now
        outputs = [lw.get(path)[1] for path in ("/metrics", "/api/status", "/status", "/healthz", "/readyz", "/")]
        outputs.append(run_cli("check", "-c", str(lw.config_path), env=env).stdout)
        for bad_dsn in (f"host=x password={SECRET}-dsn = junk", f"postgresql://u:{SECRET}-uri@[::1/db"):
            broken = dict(config)
            broken["clusters"] = [dict(cluster, primary={"dsn": bad_dsn})]
            bad_path = tmp_path / "bad.yaml"
            bad_path.write_text(yaml.safe_dump(broken))
            result = run_cli("validate", "-c", str(bad_path))
            assert result.returncode == 2 and "clusters[0].primary.dsn" in result.stderr, result.stderr
            outputs += [result.stdout, result.stderr]
    finally:
        lw.stop()
    outputs.append(lw.log_text())
    assert "down" in lw.log_text()  # the log did talk about the failing node ...
    assert "PgBouncer admin console" in lw.log_text()  # ... and about the failing pooler
    for text in outputs:
        assert SECRET not in text


def test_a_primary_dsn_that_reaches_a_replica_is_a_replica(pg_cluster: ChaosCluster, tmp_path: Path) -> None:
    # Roles are observed, not configured: a "primary" DSN that points at a replica reaches
    # a replica (up, not an error), and the cluster has no primary, said plainly.
    port = free_port(["127.0.0.1"])
    config = cluster_config(pg_cluster, port)
    config["clusters"][0]["primary"]["dsn"] = pg_cluster.replicas[0].dsn()
    with Lagwatch(tmp_path, config) as lw:
        lw.wait_ready()
        lw.wait_for("roles observed", lambda: lw.value("lagwatch_node_role", node="primary", role="replica") == 1,
                    timeout=10)
        assert lw.value("lagwatch_up", node="primary") == 1
        assert lw.value("lagwatch_node_role", node="primary", role="primary") == 0
        assert lw.value("lagwatch_cluster_primaries") == 0
        assert "main: no node accepts writes" in lw.log_text()


def test_a_50ms_interval_works_end_to_end(pg_cluster: ChaosCluster, tmp_path: Path) -> None:
    """A 50 ms interval: nearly every cycle reads the replicas and few overrun it, the
    window and histogram fill, the status page and `lagwatch check` speak milliseconds
    (counted in the product's cycles: how many a second a host makes is a speed, and
    bench/cycle.py measures what a cycle costs)."""
    lw = Lagwatch.for_cluster(tmp_path, pg_cluster, interval="50ms", window="10s")
    try:
        lw.wait_ready()
        with Writer(pg_cluster, every=0.01):
            lw.wait_cycles(20)  # the writes have reached the readings
            cycles, sampled = (lw.daemon_value("lagwatch_cycles_total") or 0,
                               lw.value("lagwatch_replica_lag_sampled_seconds_count", replica="replica1") or 0)
            lw.wait_cycles(80)  # 4 s of cycles at 50 ms on a quiet host
            moved = (lw.daemon_value("lagwatch_cycles_total") or 0) - cycles
            got = (lw.value("lagwatch_replica_lag_sampled_seconds_count", replica="replica1") or 0) - sampled
            assert got >= 0.8 * moved, (got, moved)  # a reading in (nearly) every cycle
            assert lw.daemon_value("lagwatch_interval_seconds") == 0.05
            overruns = lw.daemon_value("lagwatch_cycle_overruns_total") or 0
            assert overruns <= 0.1 * (lw.daemon_value("lagwatch_cycles_total") or 0), overruns
            window = lw.value("lagwatch_replica_lag_window_samples", replica="replica1")
            assert window is not None and window >= 80, window
            page = lw.get("/status")[1]
            assert "ms" in page and "max_lag 10s" in page
    finally:
        lw.stop()
    out = run_cli("check", "-c", str(lw.config_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ms" in out.stdout.splitlines()[2], out.stdout
