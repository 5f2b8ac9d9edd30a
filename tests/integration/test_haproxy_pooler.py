"""HAProxyPooler against a real HAProxy 2.6 (Debian's /usr/sbin/haproxy) started per test."""

from __future__ import annotations

import logging
import select
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from haproxy_server import HAPROXY, HAProxyServer
from lagwatch.config import HAProxyPoolerConfig
from lagwatch.demo.ports import free_port
from lagwatch.poolers.base import PoolerError
from lagwatch.poolers.haproxy import ADMF_FDRAIN, ADMF_FMAINT, HAProxyPooler, parse_servers_state

pytestmark = pytest.mark.skipif(not HAPROXY.exists(), reason=f"{HAPROXY} not installed (apt-get install haproxy)")

BACKEND = "pg_read"
MAPPING = {"replica1": "pg1", "replica2": "pg2"}  # lagwatch member -> HAProxy server
BOTH = frozenset(MAPPING)


class CountingPooler(HAProxyPooler):
    """Records every runtime-API command; can answer some with an error, or swallow the sets."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands: list[str] = []
        self.refuse: dict[str, str] = {}  # command line -> error text answered instead of sending it
        self.swallow_sets = False

    def command(self, line: str) -> str:
        self.commands.append(line)
        if line in self.refuse:
            return self.refuse[line]
        if self.swallow_sets and line.startswith("set "):
            return "\n"
        return super().command(line)

    @property
    def set_commands(self) -> list[str]:
        return [c for c in self.commands if c.startswith("set ")]


@pytest.fixture
def listeners() -> Iterator[dict[str, socket.socket]]:
    """Two loopback TCP listeners standing in for the replicas (health checks pass)."""
    socks: dict[str, socket.socket] = {}
    try:
        for server in MAPPING.values():
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sock.listen(64)
            socks[server] = sock
        yield socks
    finally:
        for sock in socks.values():
            sock.close()


@pytest.fixture
def hx(tmp_path_factory: pytest.TempPathFactory, listeners: dict[str, socket.socket]) -> Iterator[HAProxyServer]:
    servers: dict[str, tuple[str, int]] = {name: sock.getsockname() for name, sock in listeners.items()}
    servers["other"] = ("127.0.0.1", free_port(["127.0.0.1"]))  # not mapped, nothing listens
    with HAProxyServer(tmp_path_factory.mktemp("haproxy"), BACKEND, servers) as server:
        yield server


def make_pooler(hx: HAProxyServer, **overrides: Any) -> CountingPooler:
    fields: dict[str, Any] = {"kind": "haproxy", "socket": hx.socket, "backend": BACKEND, "servers": MAPPING}
    return CountingPooler(HAProxyPoolerConfig.model_validate(fields | overrides))


def admin_states(hx: HAProxyServer) -> dict[str, int]:
    """Admin states straight from HAProxy, not through the adapter."""
    return {n: s.admin_state for n, s in parse_servers_state(hx.command(f"show servers state {BACKEND}")).items()}


def landed_on(hx: HAProxyServer, listeners: dict[str, socket.socket], payload: bytes) -> str:
    """Open a client connection through HAProxy, send ``payload``; return which listener got it.
    Health-check connections reach the listeners too: they carry no payload and are skipped."""
    with socket.create_connection(("127.0.0.1", hx.port), timeout=2) as client:
        client.sendall(payload)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            ready, _, _ = select.select(list(listeners.values()), [], [], 0.2)
            for sock in ready:
                conn, _ = sock.accept()
                with conn:
                    conn.settimeout(0.5)
                    try:
                        data = conn.recv(len(payload))
                    except TimeoutError:
                        data = b""
                if data == payload:
                    return next(name for name, s in listeners.items() if s is sock)
    raise AssertionError("no connection reached a replica listener through HAProxy")


def test_initial_pool_has_both(hx: HAProxyServer) -> None:
    assert make_pooler(hx).read_pool() == BOTH
    assert admin_states(hx) == {"pg1": 0, "pg2": 0, "other": 0}


def test_maint_eject_and_readd(hx: HAProxyServer, listeners: dict[str, socket.socket]) -> None:
    # "other" has no listener but counts as up until its first health check fails: take it out
    # by hand so connections only go to pg1/pg2. The adapter never touches unmapped servers.
    assert hx.command(f"set server {BACKEND}/other state maint") == "\n"
    pooler = make_pooler(hx)
    pooler.apply_pool(frozenset({"replica1"}))
    assert pooler.set_commands == [f"set server {BACKEND}/pg2 state maint"]
    assert pooler.read_pool() == {"replica1"}
    assert admin_states(hx) == {"pg1": 0, "pg2": ADMF_FMAINT, "other": ADMF_FMAINT}
    # HAProxy really routes new connections to pg1 only.
    assert {landed_on(hx, listeners, f"hello{i}".encode()) for i in range(4)} == {"pg1"}

    pooler.commands.clear()
    pooler.apply_pool(BOTH)
    assert pooler.set_commands == [f"set server {BACKEND}/pg2 state ready"]
    assert pooler.read_pool() == BOTH
    assert admin_states(hx) == {"pg1": 0, "pg2": 0, "other": ADMF_FMAINT}
    assert {landed_on(hx, listeners, f"again{i}".encode()) for i in range(4)} == {"pg1", "pg2"}


def test_drain_mode(hx: HAProxyServer) -> None:
    pooler = make_pooler(hx, ejected_state="drain")
    pooler.apply_pool(frozenset({"replica2"}))
    assert pooler.set_commands == [f"set server {BACKEND}/pg1 state drain"]
    assert pooler.read_pool() == {"replica2"}
    states = parse_servers_state(hx.command(f"show servers state {BACKEND}"))
    assert states["pg1"].admin_state == ADMF_FDRAIN
    assert states["pg1"].op_state == 2  # draining, not down

    pooler.apply_pool(BOTH)
    assert pooler.read_pool() == BOTH
    assert admin_states(hx)["pg1"] == 0


def test_never_empties_the_backend_and_ready_before_eject(hx: HAProxyServer) -> None:
    pooler = make_pooler(hx)
    pooler.apply_pool(frozenset({"replica1"}))
    pooler.commands.clear()
    pooler.apply_pool(frozenset())  # every replica ejected (min_replicas 0): reads must not fail
    assert pooler.set_commands == []
    assert pooler.read_pool() == {"replica1"}
    assert pooler.routes_for(frozenset(), frozenset({"replica1"})) == {"replica1"}

    pooler.apply_pool(frozenset({"replica2"}))
    pooler.commands.clear()
    pooler.apply_pool(frozenset({"replica1"}))  # swap: add first, then remove
    assert pooler.set_commands == [f"set server {BACKEND}/pg1 state ready", f"set server {BACKEND}/pg2 state maint"]
    assert pooler.read_pool() == {"replica1"}


def test_restart_loses_runtime_state(hx: HAProxyServer) -> None:
    pooler = make_pooler(hx)
    pooler.apply_pool(frozenset({"replica1"}))
    assert pooler.read_pool() == {"replica1"}
    old_pid = hx.pid
    hx.restart()
    assert hx.pid != old_pid
    assert pooler.read_pool() == BOTH  # HAProxy forgot the maint: the daemon must notice and re-apply
    pooler.apply_pool(frozenset({"replica1"}))
    assert pooler.read_pool() == {"replica1"}


def test_noop_apply_sends_no_command(hx: HAProxyServer) -> None:
    pooler = make_pooler(hx)
    pooler.apply_pool(BOTH)
    assert pooler.commands == [f"show servers state {BACKEND}"]

    pooler.apply_pool(frozenset({"replica2"}))
    pooler.commands.clear()
    pooler.apply_pool(frozenset({"replica2"}))
    assert pooler.commands == [f"show servers state {BACKEND}"]


def test_unmapped_member_ignored_and_warned_once(hx: HAProxyServer, caplog: pytest.LogCaptureFixture) -> None:
    pooler = make_pooler(hx)
    with caplog.at_level(logging.WARNING, logger="lagwatch.poolers.haproxy"):
        pooler.apply_pool(BOTH | {"primary"})
        pooler.apply_pool(frozenset({"replica1", "primary"}))
        pooler.apply_pool(BOTH | {"primary"})
    warnings = [r for r in caplog.records if r.name == "lagwatch.poolers.haproxy" and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "'primary'" in warnings[0].getMessage()
    assert pooler.read_pool() == BOTH


def test_unreachable_socket(hx: HAProxyServer) -> None:
    missing = hx.workdir / "nosuch.sock"
    with pytest.raises(PoolerError, match=f"HAProxy stats socket {missing} unreachable: No such file"):
        make_pooler(hx, socket=missing).read_pool()

    pooler = make_pooler(hx)
    hx.stop()  # HAProxy leaves the socket file behind: connection refused
    with pytest.raises(PoolerError, match=f"HAProxy stats socket {hx.socket} unreachable"):
        pooler.read_pool()
    with pytest.raises(PoolerError, match="unreachable"):
        pooler.apply_pool(frozenset({"replica1"}))


def test_unknown_backend(hx: HAProxyServer) -> None:
    pooler = make_pooler(hx, backend="nosuch")
    with pytest.raises(PoolerError, match=r"HAProxy backend 'nosuch' not readable via .*Can't find backend"):
        pooler.read_pool()
    with pytest.raises(PoolerError, match="'nosuch'"):
        pooler.apply_pool(frozenset({"replica1"}))
    assert pooler.set_commands == []


def test_mapped_server_missing_from_backend(hx: HAProxyServer) -> None:
    pooler = make_pooler(hx, servers={"replica1": "pg1", "replica2": "pg9"})
    with pytest.raises(PoolerError, match=f"HAProxy backend '{BACKEND}' .* has no server\\(s\\) pg9$"):
        pooler.read_pool()
    with pytest.raises(PoolerError, match="pg9"):
        pooler.apply_pool(frozenset({"replica1"}))
    assert pooler.set_commands == []
    assert admin_states(hx) == {"pg1": 0, "pg2": 0, "other": 0}


def test_refused_command_rolls_back(hx: HAProxyServer) -> None:
    pooler = make_pooler(hx)
    pooler.apply_pool(frozenset({"replica1"}))
    pooler.commands.clear()
    pooler.refuse[f"set server {BACKEND}/pg1 state maint"] = "No such server.\n\n"
    with pytest.raises(PoolerError) as info:
        pooler.apply_pool(frozenset({"replica2"}))  # swap: pg2 ready first, then pg1 out (refused)
    message = str(info.value)
    assert f"HAProxy refused 'set server {BACKEND}/pg1 state maint'" in message
    assert "No such server." in message
    assert "rolled back replica2" in message
    assert pooler.set_commands == [f"set server {BACKEND}/pg2 state ready", f"set server {BACKEND}/pg1 state maint",
                                   f"set server {BACKEND}/pg2 state maint"]
    assert pooler.read_pool() == {"replica1"}


def test_real_haproxy_error_text(hx: HAProxyServer) -> None:
    pooler = make_pooler(hx)
    # Answer the set with what HAProxy really says for a server it does not know.
    pooler.refuse[f"set server {BACKEND}/pg2 state maint"] = hx.command(f"set server {BACKEND}/nosuch state maint")
    with pytest.raises(PoolerError, match="No such server"):
        pooler.apply_pool(frozenset({"replica1"}))


def test_verification_failure(hx: HAProxyServer) -> None:
    pooler = make_pooler(hx)
    pooler.swallow_sets = True  # HAProxy answers OK but nothing changes
    with pytest.raises(PoolerError, match=r"routes to \['replica1', 'replica2'\] after apply, wanted \['replica1'\]"):
        pooler.apply_pool(frozenset({"replica1"}))
    assert admin_states(hx) == {"pg1": 0, "pg2": 0, "other": 0}
