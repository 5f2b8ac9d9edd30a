"""systemd: the shipped units verify, and the notify protocol on a real datagram socket."""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from chaoscluster import ChaosCluster
from harness import ROOT, Lagwatch, cluster_config
from lagwatch.demo.ports import free_port

UNITS = ROOT / "deploy" / "systemd"


pytestmark = pytest.mark.one_pg_version


@pytest.mark.parametrize("unit,instance", [("lagwatch.service", "lagwatch.service"),
                                           ("lagwatch@.service", "lagwatch@main.service")])
def test_systemd_analyze_verify(tmp_path: Path, unit: str, instance: str) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing (apt-get install systemd)"
    # verify insists that ExecStart exists: point it at this interpreter.
    text = (UNITS / unit).read_text().replace("/opt/lagwatch/bin/lagwatch", sys.executable)
    (tmp_path / instance).write_text(text)
    result = subprocess.run([analyze, "verify", str(tmp_path / instance)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def unit_settings(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file as section -> key -> every assignment in order (systemd keys may repeat;
    an empty assignment resets a list). Continuation lines and comments are handled."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None and "=" in line, f"{path.name}: stray line {line!r}"
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def _one(service: dict[str, list[str]], key: str) -> str:
    values = service.get(key)
    assert values and len(values) == 1, f"{key}: expected exactly one assignment, got {values}"
    return values[0]


@pytest.mark.parametrize("unit", ["lagwatch.service", "lagwatch@.service"])
def test_unit_content(unit: str) -> None:
    settings = unit_settings(UNITS / unit)
    service = settings["Service"]
    template = "@" in unit
    config = "/etc/lagwatch/%i.yaml" if template else "/etc/lagwatch/lagwatch.yaml"
    env_file = "/etc/lagwatch/%i.env" if template else "/etc/lagwatch/lagwatch.env"

    assert _one(service, "Type") == "notify"
    assert _one(service, "NotifyAccess") == "main"
    # The venv of the README's install guide, and the instance's own config file.
    assert _one(service, "ExecStart") == f"/opt/lagwatch/bin/lagwatch run -c {config}"
    assert _one(service, "ExecReload") == "/bin/kill -HUP $MAINPID"
    assert _one(service, "Restart") == "on-failure"
    watchdog = _one(service, "WatchdogSec")
    assert watchdog.endswith("s") and float(watchdog[:-1]) >= 10, watchdog
    # password_env: in the example config needs the variable from somewhere.
    assert _one(service, "EnvironmentFile") == f"-{env_file}"

    # Least privilege.
    assert _one(service, "NoNewPrivileges") == "yes"
    assert _one(service, "ProtectSystem") == "strict"
    assert _one(service, "ProtectHome") == "yes"
    assert _one(service, "PrivateTmp") == "yes"
    assert service["CapabilityBoundingSet"] == [""], "the capability bounding set must be empty"
    assert service.get("AmbientCapabilities", [""]) == [""]
    assert _one(service, "RestrictAddressFamilies").split() == ["AF_UNIX", "AF_INET", "AF_INET6"]
    if service.get("DynamicUser") != ["yes"]:
        user = _one(service, "User")
        assert user and user not in ("root", "0"), user
    # Writes only where it must: PgBouncer's include file is replaced by a rename, so the
    # whole dedicated folder is writable, nothing else under /etc.
    writable = [p.lstrip("-") for v in service["ReadWritePaths"] for p in v.split()]
    assert writable == ["/etc/pgbouncer/lagwatch"], writable
    assert _one(service, "StateDirectory") == ("lagwatch/%i" if template else "lagwatch")
    assert settings["Install"]["WantedBy"] == ["multi-user.target"]


def _supports_offline_security(analyze: str) -> bool:
    result = subprocess.run([analyze, "--help"], capture_output=True, text=True, timeout=60)
    return "--offline" in result.stdout and "--threshold" in result.stdout


@pytest.mark.parametrize("unit,instance", [("lagwatch.service", "lagwatch.service"),
                                           ("lagwatch@.service", "lagwatch@main.service")])
def test_systemd_analyze_security(tmp_path: Path, unit: str, instance: str) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None or not _supports_offline_security(analyze):
        pytest.skip("systemd-analyze security --offline needs systemd 250+")
    (tmp_path / instance).write_text((UNITS / unit).read_text())
    # --threshold is on the 0-100 scale: 20 is an exposure level of 2.0.
    result = subprocess.run([analyze, "security", "--offline=yes", "--threshold=20", "--no-pager",
                             str(tmp_path / instance)], capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    match = re.search(rf"Overall exposure level for {re.escape(instance)}: (\d+\.\d+) (\w+)", output)
    assert match, output[-3000:]
    assert float(match.group(1)) <= 2.0, match.group(0)
    assert result.returncode == 0, output[-3000:]


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


def test_notify_ready_watchdog_reload_stop(pg_cluster: ChaosCluster, tmp_path: Path, notify: NotifySocket) -> None:
    config = cluster_config(pg_cluster, free_port(["127.0.0.1"]))
    env = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "30000000"}
    with Lagwatch(tmp_path, config, env=env) as lw:
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


def test_no_watchdog_while_polls_fail(tmp_path: Path, notify: NotifySocket) -> None:
    dead = free_port(["127.0.0.1"])  # nothing listens here
    config = {"interval": "1s", "listen": f"127.0.0.1:{free_port(['127.0.0.1'])}", "clusters": [{
        "name": "main", "primary": {"dsn": f"host=127.0.0.1 port={dead} user=postgres dbname=postgres"}}]}
    with Lagwatch(tmp_path, config, env={"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "3000000"}):
        assert "READY" in notify.wait_for("READY", timeout=30)
        later = notify.drain(5.0)
        assert not [m for m in later if "WATCHDOG" in m], later
        assert any("no node answered" in m.get("STATUS", "") for m in later), later


def test_watchdog_extended_to_the_interval(tmp_path: Path, notify: NotifySocket) -> None:
    # WatchdogSec=2s with a 3s interval: systemd would restart lagwatch between two cycles.
    # lagwatch asks for 11 intervals (it keeps up to 10 between cycles while they do not fit)
    # + the query timeout (80% of the interval): 33s + 2.4s.
    dead = free_port(["127.0.0.1"])  # no PostgreSQL needed: the budget depends on the config only
    config = {"interval": "3s", "listen": f"127.0.0.1:{free_port(['127.0.0.1'])}", "clusters": [{
        "name": "main", "primary": {"dsn": f"host=127.0.0.1 port={dead} user=postgres dbname=postgres"}}]}
    with Lagwatch(tmp_path, config, env={"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "2000000"}) as lw:
        extended = notify.wait_for("WATCHDOG_USEC", timeout=30)
        assert extended["WATCHDOG_USEC"] == "35400000", extended
        # Sent before the first poll completes, so systemd never kills the first cycles.
        assert "READY" in notify.wait_for("READY", timeout=30)
        later = notify.drain(4.0)
        assert not [m for m in later if "WATCHDOG_USEC" in m], later  # once, not every cycle
        assert lw.log_text().count("extended to 35.4s") == 1, lw.log_text()

        # A reload to a shorter interval goes back down, never below the unit's 2s ...
        lw.write_config({**config, "interval": "100ms"})  # 11 * 100ms + 80ms: under 2s
        lw.signal(signal.SIGHUP)
        assert notify.wait_for("WATCHDOG_USEC", timeout=10)["WATCHDOG_USEC"] == "2000000"
        assert "READY" in notify.wait_for("READY", timeout=10)
        # ... and one to a longer interval raises it again: 11 * 5s + 4s.
        lw.write_config({**config, "interval": "5s"})
        lw.signal(signal.SIGHUP)
        assert notify.wait_for("WATCHDOG_USEC", timeout=10)["WATCHDOG_USEC"] == "59000000"
        assert "READY" in notify.wait_for("READY", timeout=10)


def test_no_watchdog_extension_when_the_budget_is_enough(tmp_path: Path, notify: NotifySocket) -> None:
    dead = free_port(["127.0.0.1"])
    config = {"interval": "1s", "listen": f"127.0.0.1:{free_port(['127.0.0.1'])}", "clusters": [{
        "name": "main", "primary": {"dsn": f"host=127.0.0.1 port={dead} user=postgres dbname=postgres"}}]}
    with Lagwatch(tmp_path, config, env={"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "30000000"}):
        assert "READY" in notify.wait_for("READY", timeout=30)
        assert not [m for m in notify.drain(2.0) if "WATCHDOG_USEC" in m]
        assert not [m for _, m in notify.messages if "WATCHDOG_USEC" in m], notify.messages
