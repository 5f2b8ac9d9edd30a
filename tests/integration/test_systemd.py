"""systemd: the shipped units verify, and the notify protocol on a real datagram socket."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import ROOT, Lagwatch, cluster_config
from lagwatch.localcluster import LocalCluster, free_port

UNITS = ROOT / "deploy" / "systemd"


pytestmark = pytest.mark.one_pg_version


@pytest.mark.parametrize("unit,instance", [("lagwatch.service", "lagwatch.service"),
                                           ("lagwatch@.service", "lagwatch@main.service")])
def test_systemd_analyze_verify(tmp_path: Path, unit: str, instance: str) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing (apt-get install systemd)"
    # verify insists that ExecStart exists: point it at this interpreter.
    text = (UNITS / unit).read_text().replace("/usr/local/bin/lagwatch", sys.executable)
    (tmp_path / instance).write_text(text)
    result = subprocess.run([analyze, "verify", str(tmp_path / instance)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


class NotifySocket:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._next = 0

    def _receive(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.append((time.monotonic(), fields))

    def drain(self, seconds: float) -> list[dict[str, str]]:
        """Every message not yet consumed, after listening for ``seconds`` more."""
        self._receive(seconds)
        got = [m for _, m in self.messages[self._next:]]
        self._next = len(self.messages)
        return got

    def wait_for(self, key: str, timeout: float) -> dict[str, str]:
        """The next message carrying ``key``; messages before it are consumed."""
        deadline = time.monotonic() + timeout
        while True:
            for index in range(self._next, len(self.messages)):
                if key in self.messages[index][1]:
                    self._next = index + 1
                    return self.messages[index][1]
            if time.monotonic() > deadline:
                raise AssertionError(f"no {key} within {timeout}s; got {[m for _, m in self.messages]}")
            self._receive(0.2)


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifySocket]:
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.sock.close()


def test_notify_ready_watchdog_reload_stop(pg_cluster: LocalCluster, tmp_path: Path, notify: NotifySocket) -> None:
    config = cluster_config(pg_cluster, free_port(["127.0.0.1"]))
    env = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "30000000"}
    lw = Lagwatch(tmp_path, config, env=env)
    try:
        ready = notify.wait_for("READY", timeout=30)
        # READY comes after the first completed poll: its STATUS already has measurements.
        assert "replica1=" in ready["STATUS"] and "replica2=" in ready["STATUS"], ready
        watchdogs = [m for m in notify.drain(5.0) if m.get("WATCHDOG") == "1"]
        assert 4 <= len(watchdogs) <= 6, watchdogs
        lw.signal(signal.SIGHUP)
        reloading = notify.wait_for("RELOADING", timeout=10)
        assert "MONOTONIC_USEC" in reloading
        assert "READY" in notify.wait_for("READY", timeout=10)
        lw.signal(signal.SIGTERM)
        assert "STOPPING" in notify.wait_for("STOPPING", timeout=5)
        assert lw.proc.wait(5) == 0
    finally:
        lw.stop()


def test_no_watchdog_while_polls_fail(tmp_path: Path, notify: NotifySocket) -> None:
    dead = free_port(["127.0.0.1"])  # nothing listens here
    config = {"interval": "1s", "listen": f"127.0.0.1:{free_port(['127.0.0.1'])}", "clusters": [{
        "name": "main", "primary": {"dsn": f"host=127.0.0.1 port={dead} user=postgres dbname=postgres"}}]}
    lw = Lagwatch(tmp_path, config, env={"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "3000000"})
    try:
        assert "READY" in notify.wait_for("READY", timeout=30)
        later = notify.drain(5.0)
        assert not [m for m in later if "WATCHDOG" in m], later
        assert any("no node answered" in m.get("STATUS", "") for m in later), later
    finally:
        lw.stop()
