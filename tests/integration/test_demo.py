"""`lagwatch demo`: comes up with two streaming replicas, shows lag, and on SIGTERM
removes every process and data directory it made."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness import ROOT, LagwatchHttp
from lagwatch.localcluster import free_port


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
                             "--duration", "120"], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
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
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        log.close()
    assert code == 0, (tmp_path / "demo.log").read_text()
    assert not Path(data_dir).exists()
    assert _pids_under(data_dir) == []
