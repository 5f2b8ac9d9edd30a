"""Runs the real `lagwatch run` as a subprocess and reads its HTTP endpoints."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import failure_logs
import yaml
from chaoscluster import ChaosCluster
from lagwatch.demo.ports import free_port
from lagwatch.demo.servers import LocalServer
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]


def cluster_config(cluster: ChaosCluster, port: int, *, interval: str = "1s", window: str = "1m",
                   replicas: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    chosen = [r for r in cluster.replicas if replicas is None or r.name in replicas]
    return {
        "interval": interval,
        "window": window,
        "listen": f"127.0.0.1:{port}",
        **extra,
        "clusters": [{
            "name": "main",
            "primary": {"dsn": cluster.primary.dsn()},
            "replicas": [{"name": r.name, "dsn": r.dsn()} for r in chosen],
        }],
    }


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class LagwatchHttp:
    """Reads a running lagwatch's HTTP endpoints."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.auth: tuple[str, str] | None = None  # basic auth user and password, if the web config wants them

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str) -> tuple[int, str]:
        request = urllib.request.Request(self.url(path))
        if self.auth is not None:
            import base64

            token = base64.b64encode(f"{self.auth[0]}:{self.auth[1]}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                if self.get("/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"lagwatch not ready within {timeout}s")

    def _check_alive(self) -> None:
        pass

    def samples(self) -> Samples:
        status, text = self.get("/metrics")
        assert status == 200, text
        out: Samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[(sample.name, frozenset(sample.labels.items()))] = sample.value
        return out

    def value(self, name: str, **labels: str) -> float | None:
        labels.setdefault("cluster", "main")
        return self.samples().get((name, frozenset(labels.items())))

    def expect(self, name: str, expected: float, timeout: float = 5, **labels: str) -> None:
        """Wait until a metric reads ``expected``. The pooler is told of a change before the
        cycle that decided it publishes its metrics, so a test that has just seen the pooler
        change must give /metrics that moment to catch up."""
        last: list[float | None] = []
        try:
            self.wait_for(f"{name}{labels} == {expected}",
                          lambda: last.append(self.value(name, **labels)) or last[-1] == expected, timeout)
        except AssertionError:
            raise AssertionError(f"{name}{labels} is {last[-1] if last else None}, not {expected}") from None

    def daemon_value(self, name: str) -> float | None:
        """A metric about the daemon itself (no labels)."""
        return self.samples().get((name, frozenset()))

    def status(self) -> dict[str, Any]:
        code, text = self.get("/api/status")
        assert code == 200
        result: dict[str, Any] = json.loads(text)
        return result

    def cycles(self) -> int:
        """Poll cycles completed so far (``lagwatch_cycles_total``), read with a regex: a
        fleet's /metrics is megabytes, too much to parse ten times a second."""
        status, text = self.get("/metrics")
        assert status == 200, text
        found = re.search(r"^lagwatch_cycles_total (\S+)$", text, re.M)
        return int(float(found.group(1))) if found else 0

    def wait_cycles(self, count: int, timeout: float | None = None) -> None:
        """Wait until lagwatch has completed ``count`` more cycles. A test that watches
        something stay steady watches it for cycles of the product, not for seconds of a
        shared host's clock (on a busy host a second may hold no cycle at all)."""
        target = self.cycles() + count
        self.wait_for(f"{count} more cycles", lambda: self.cycles() >= target,
                      timeout if timeout is not None else 20 + 5 * count)

    def wait_for(self, what: str, predicate: Callable[[], bool], timeout: float) -> float:
        """Wait until ``predicate()``; return how long it took."""
        started = time.monotonic()
        while True:
            if predicate():
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.1)


class Lagwatch(LagwatchHttp):
    """One `lagwatch run` process with its config file and log."""

    def __init__(self, workdir: Path, config: dict[str, Any], env: dict[str, str] | None = None,
                 max_descriptors: int | None = None, log_level: str = "debug") -> None:
        super().__init__(int(config["listen"].rsplit(":", 1)[1]))
        self.workdir = workdir
        self.config_path = workdir / "lagwatch.yaml"
        self.log_path = workdir / "lagwatch.log"
        self.write_config(config)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lagwatch.cli", "--log-level", log_level, "run", "-c", str(self.config_path)],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT / "daemon"), **(env or {})},
            preexec_fn=None if max_descriptors is None else lambda: resource.setrlimit(
                resource.RLIMIT_NOFILE, (max_descriptors, max_descriptors)))
        failure_logs.watch(self, f"lagwatch {self.log_path}", self.log_tail)

    @classmethod
    def for_cluster(cls, workdir: Path, cluster: ChaosCluster, **kwargs: Any) -> Lagwatch:
        port = free_port(["127.0.0.1"])
        return cls(workdir, cluster_config(cluster, port, **kwargs))

    def write_config(self, config: dict[str, Any]) -> None:
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    def _check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"lagwatch exited {self.proc.returncode}:\n{self.log_text()[-3000:]}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_logged(self, text: str, count: int = 1, timeout: float = 5) -> None:
        """Wait until ``text`` is in the log ``count`` times. The pooler shows a change the
        moment it is made; the line that says so follows a moment later."""
        self.wait_for(f"{count} x {text!r} in the log", lambda: self.log_text().count(text) >= count, timeout)

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def __enter__(self) -> Lagwatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        failure_logs.unwatch(self)
        return self.proc.returncode


@dataclass(frozen=True)
class Reading:
    replica: str
    at: float  # lagwatch's monotonic time the reading is for (CLOCK_MONOTONIC, as time.monotonic())
    seconds: float
    evidence: str
    replay_lsn: str | None = None
    bound: str | None = None  # the proven bound that moved the estimate, if one did


class Readings:
    """Every staleness reading a running lagwatch publishes, collected from /api/status
    in a background thread (each reading carries the instant it is for)."""

    def __init__(self, lw: LagwatchHttp, every: float = 0.03) -> None:
        import threading

        self.lw = lw
        self.every = every
        self._seen: dict[tuple[str, float], Reading] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                status = self.lw.status()
            except (OSError, AssertionError):
                continue
            for cluster in status["clusters"]:
                for r in cluster["replicas"]:
                    at, value = r.get("staleness_measured_at_monotonic"), r.get("staleness_seconds")
                    if at is not None and value is not None:
                        self._seen[(r["name"], at)] = Reading(r["name"], at, value, r.get("staleness_evidence") or "",
                                                              r.get("replay_lsn"), r.get("staleness_bound"))
                for c in cluster.get("logical_consumers", ()):  # by slot, under "logical:SLOT"
                    at, value = c.get("staleness_measured_at_monotonic"), c.get("staleness_seconds")
                    if at is not None and value is not None:
                        name = "logical:" + c["slot"]
                        self._seen[(name, at)] = Reading(name, at, value, c.get("staleness_evidence") or "",
                                                         c.get("position"))

    def __enter__(self) -> Readings:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def of(self, replica: str, start: float = 0.0, end: float = float("inf")) -> list[Reading]:
        return sorted((r for r in list(self._seen.values()) if r.replica == replica and start <= r.at <= end),
                      key=lambda r: r.at)


class Writer:
    """Writes on the primary in a background thread (bounded: stops by itself)."""

    def __init__(self, cluster: ChaosCluster, every: float = 0.1, max_seconds: float = 120,
                 on: LocalServer | None = None) -> None:
        import threading

        self.cluster = cluster
        self.every = every
        self.max_seconds = max_seconds
        self._stop = threading.Event()
        self.first_write_at: float | None = None
        self.commits = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.server = on or cluster.primary  # where to write: the primary, or the one promoted
        self.server.execute("CREATE TABLE IF NOT EXISTS lw_test (id bigserial PRIMARY KEY, v text)")

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set() and time.monotonic() - started < self.max_seconds:
            before = time.monotonic()
            self.server.execute("INSERT INTO lw_test (v) SELECT md5(g::text) FROM generate_series(1, 50) g")
            if self.first_write_at is None:
                self.first_write_at = before
            self.commits += 1
            self._stop.wait(self.every)

    def __enter__(self) -> Writer:
        self._thread.start()
        while self.first_write_at is None and self._thread.is_alive():
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def wait_commits(self, count: int, timeout: float = 30) -> None:
        """Wait until ``count`` more transactions have been committed: WAL for the replicas
        to stream, counted in commits rather than in seconds of writing."""
        target = self.commits + count
        deadline = time.monotonic() + timeout
        while self.commits < target:
            assert self._thread.is_alive(), f"the writer stopped after {self.commits} commits"
            assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {count} commits"
            time.sleep(0.02)


def let_time_pass(seconds: float) -> None:
    """Let ``seconds`` of wall time pass, where time itself is what the test needs. Lag is
    time: a paused or delayed replica falls behind by the second; a window or a forecast
    horizon fills by the second. A test that needs a replica N seconds behind, or N seconds
    of readings, has nothing to wait on but the clock (each caller says which)."""
    time.sleep(seconds)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the `lagwatch` CLI as a subprocess from this checkout."""
    return subprocess.run([sys.executable, "-m", "lagwatch.cli", *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "daemon"), **(env or {})})


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium (Debian's), with a throwaway profile."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary, "chromium is not installed (apt-get install chromium)"
    with tempfile.TemporaryDirectory(prefix="lagwatch-chromium-") as profile:
        return subprocess.run(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=90)
