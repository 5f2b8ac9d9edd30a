"""`lagwatch demo --switchover`: comes up with two streaming replicas, shows lag and a read
pool (a real PgBouncer) that replica1 leaves while its replay is paused (on /status, in
headless Chromium, in PgBouncer's include file and in a read through it), then switches
over (replica2 promoted) and shows roles, the alert conditions it raises and the pool
follow; on SIGTERM it removes every
process and data directory it made."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from harness import ROOT, LagwatchHttp, chromium
from lagwatch.demo.ports import free_port


def _pids_under(folder: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if folder in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def test_demo_runs_and_cleans_up(tmp_path: Path) -> None:
    port = free_port(["127.0.0.1"])
    log = open(tmp_path / "demo.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "lagwatch.cli", "demo", "--listen", f"127.0.0.1:{port}",
                             "--duration", "120", "--switchover", "20s"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "daemon")})
    try:
        deadline = time.monotonic() + 60
        text = ""
        while "data " not in text and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            text = (tmp_path / "demo.log").read_text(errors="replace")
        match = re.search(r"data\s+(\S+)", text)
        assert match, text
        data_dir = match.group(1)
        assert Path(data_dir).is_dir() and _pids_under(data_dir)

        view = LagwatchHttp(port)
        view.wait_ready(timeout=30)
        view.wait_for("both replicas measured", lambda: all(
            view.samples().get(("lagwatch_replica_lag_seconds",
                                frozenset({"cluster": "demo", "replica": r}.items()))) is not None
            for r in ("replica1", "replica2")), timeout=30)
        assert "lagwatch demo is running" in text
        # replica2 applies 30 ms late under a steady stream: it reads milliseconds, not 0.
        view.wait_for("replica2 reads its 30 ms apply delay", lambda: 0.015 <= (view.samples().get(
            ("lagwatch_replica_lag_window_seconds",
             frozenset({"cluster": "demo", "replica": "replica2", "quantile": "0.5"}.items()))) or 0) <= 0.045,
            timeout=30)
        # replica1's first pause (8 s in) takes it past its 2 s SLA: out of the read pool.
        view.wait_for("replica1 out of the read pool", lambda: view.samples().get(
            ("lagwatch_pool_member", frozenset({"cluster": "demo", "replica": "replica1"}.items()))) == 0,
            timeout=40)
        dom = chromium("--dump-dom", f"http://127.0.0.1:{port}/status").stdout
        assert re.search(r"<b>eject</b> replica1: staleness .* &gt; max_lag 2s", dom), dom[-3000:]
        pool_file = re.search(r"read pool\s+(\S+)", text)
        assert pool_file, text
        written = Path(pool_file.group(1)).read_text()
        hosts = dict(re.findall(r"(replica\d): ([\d.]+):\d+", text))
        # Debian's PgBouncer is installed here: the demo's read pool is a real one.
        through = re.search(r'PgBouncer\'s app_ro: psql "([^"]+)"', text)
        assert through, text
        assert hosts["replica2"] in written and hosts["replica1"] not in written, written
        with psycopg.connect(through.group(1), connect_timeout=5) as conn:  # a read through the pool
            assert str(conn.execute("SELECT inet_server_addr()").fetchone()[0]) == hosts["replica2"]  # type: ignore[index]

        def value(name: str, **labels: str) -> float | None:
            return view.samples().get((name, frozenset({"cluster": "demo", **labels}.items())))

        # The switchover (20 s in): replica2 is the primary now, one primary, a role change;
        # it leaves the read pool, which is never empty.
        view.wait_for("replica2 promoted", lambda: value("lagwatch_node_role", node="replica2", role="primary") == 1,
                      timeout=40)
        view.wait_for("the primary DSN on the new primary",
                      lambda: value("lagwatch_node_timeline", node="primary") == 2, timeout=20)
        assert value("lagwatch_cluster_primaries") == 1
        assert (value("lagwatch_cluster_role_changes_total") or 0) >= 1
        view.wait_for("replica2 out of the pool", lambda: value("lagwatch_pool_member", replica="replica2") == 0,
                      timeout=10)
        dom = chromium("--dump-dom", f"http://127.0.0.1:{port}/status").stdout
        assert "replica2 primary (timeline 2)" in dom, dom[-3000:]
        assert re.search(r"<b>eject</b> replica2: promoted: it accepts writes now", dom), dom[-3000:]
        # What the shipped rules are about to raise: the role change, for the record.
        assert re.search(r"<b>LagwatchRoleChanged</b>: replica2: replica -&gt; primary \(timeline 2\) \d", dom), \
            dom[-3000:]
        # Never empty: replica1 serves, once this instance holds the leader lock on the new
        # primary (its first cycle there may not take it yet: the pooler keeps what it had,
        # the promoted replica2, till then).
        pool_path = Path(pool_file.group(1))
        view.wait_for("replica1 serves the read pool", lambda: hosts["replica1"] in pool_path.read_text(), timeout=10)
    finally:
        proc.send_signal(signal.SIGTERM)
        # A second SIGTERM while it cleans up (an impatient user; `timeout` signals its
        # process group too) must not end it half way: before, it left the servers' data.
        until = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < until and "demo: stopping servers" not in (
                tmp_path / "demo.log").read_text(errors="replace"):
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        log.close()
    assert code == 0, (tmp_path / "demo.log").read_text()
    assert not Path(data_dir).exists()
    assert _pids_under(data_dir) == []
