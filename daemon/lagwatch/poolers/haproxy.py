"""HAProxy adapter: take servers of one backend in and out of rotation over the runtime API.

It talks to the stats socket (``stats socket ... level admin``), one command per connection:
``show servers state BACKEND`` to read, ``set server BACKEND/SERVER state ready|maint|drain``
to change. Only the administrative state is touched; health checks (the operational state)
stay HAProxy's business, so a member whose server is down but not in maintenance still counts
as in the pool. Runtime state is not persisted by HAProxy: after a restart (without a
server-state-file) every server is back in rotation, and the daemon's next read sees that.
"""

from __future__ import annotations

import logging
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lagwatch.config import HAProxyPoolerConfig
from lagwatch.poolers.base import PoolerError

log = logging.getLogger("lagwatch.poolers.haproxy")

# srv_admin_state bits (HAProxy doc/management.txt, "show servers state"), checked on 2.6.
ADMF_FMAINT = 0x01  # forced into maintenance ("set server ... state maint", "disable server")
ADMF_IMAINT = 0x02  # maintenance inherited from a tracked server
ADMF_CMAINT = 0x04  # configured "disabled"; stays set after "state ready" although the server serves again
ADMF_FDRAIN = 0x08  # forced into drain ("set server ... state drain")
ADMF_IDRAIN = 0x10  # drain inherited from a tracked server
ADMF_RMAINT = 0x20  # maintenance because of an address resolution failure
ADMF_HMAINT = 0x40  # FQDN set/changed at runtime: a marker, not a maintenance state
# HAProxy's own masks (SRV_ADMF_MAINT = 0x23, SRV_ADMF_DRAIN = 0x18): CMAINT and HMAINT are not in them.
MAINT_MASK = ADMF_FMAINT | ADMF_IMAINT | ADMF_RMAINT
DRAIN_MASK = ADMF_FDRAIN | ADMF_IDRAIN

# HAProxy accepts only these characters in proxy and server names; checking them also keeps
# a name from smuggling a second command (';' or a newline) into the runtime API.
_NAME_RE = re.compile(r"[A-Za-z0-9._:-]+")
_REQUIRED_COLUMNS = ("srv_name", "srv_op_state", "srv_admin_state")
_VERIFY_SETTLE = 1.0  # at most this long (and never beyond the timeout) for a change to show up

AdminCommand = Literal["ready", "maint", "drain"]


@dataclass(frozen=True)
class ServerState:
    """One row of ``show servers state``: the parts the adapter needs."""

    name: str  # HAProxy server name
    op_state: int  # 0 stopped, 1 starting, 2 running, 3 stopping (health checks)
    admin_state: int  # mask of the ADMF_* bits

    @property
    def in_rotation(self) -> bool:
        """Neither in maintenance nor draining (whatever the health checks say)."""
        return not self.admin_state & (MAINT_MASK | DRAIN_MASK)


def parse_servers_state(text: str) -> dict[str, ServerState]:
    """Parse the answer to ``show servers state BACKEND``: a format version line, a ``# ...``
    column header, one row per server. Columns are found by header name. Raises ValueError
    (with HAProxy's error text when it answered one) if ``text`` is not such an answer."""
    lines = text.splitlines()
    first = lines[0].strip() if lines else ""
    if not first.isdigit():
        answer = " ".join(line.strip() for line in lines if line.strip())
        raise ValueError(f"not a 'show servers state' answer: {answer or 'empty answer'!r}")
    header: list[str] | None = None
    out: dict[str, ServerState] = {}
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        if line.startswith("#"):
            if header is None:
                header = line[1:].split()
                missing = [c for c in _REQUIRED_COLUMNS if c not in header]
                if missing:
                    raise ValueError(f"'show servers state' header lacks column(s) {', '.join(missing)}")
            continue  # any later '#' line is a comment
        if header is None:
            raise ValueError("'show servers state' answer has no '# be_id be_name ...' header line")
        fields = line.split()
        if len(fields) != len(header):
            raise ValueError(f"'show servers state' line {lineno} has {len(fields)} fields, header has {len(header)}")
        row = dict(zip(header, fields, strict=True))
        name = row["srv_name"]
        try:
            state = ServerState(name=name, op_state=int(row["srv_op_state"]),
                                admin_state=int(row["srv_admin_state"]))
        except ValueError:
            raise ValueError(f"'show servers state' line {lineno}: bad state numbers for server {name!r}") from None
        if name in out:
            raise ValueError(f"'show servers state' lists server {name!r} twice (several backends?)")
        out[name] = state
    if header is None:
        raise ValueError("'show servers state' answer has no '# be_id be_name ...' header line")
    return out


class HAProxyPooler:
    """Pooler adapter for one HAProxy backend; members map to servers via ``config.servers``."""

    kind = "haproxy"
    # A restarted HAProxy forgets every runtime change: looked at often (one socket exchange).
    read_back_every = 2.0

    def __init__(self, config: HAProxyPoolerConfig, timeout: float = 2.0) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self._socket: Path = config.socket
        self._backend = config.backend
        self._servers: Mapping[str, str] = dict(config.servers)  # member -> HAProxy server
        self._ejected: AdminCommand = config.ejected_state
        self._timeout = timeout
        self._warned: set[str] = set()
        # Names and the one-server-per-member mapping are checked when the config loads.

    # -- runtime API -------------------------------------------------------------------------

    def command(self, line: str) -> str:
        """Send one runtime-API command on a fresh connection; return HAProxy's whole answer."""
        if "\n" in line or ";" in line:
            raise ValueError(f"one command per call, without ';' or newlines: {line!r}")
        path = str(self._socket)
        deadline = time.monotonic() + self._timeout
        chunks: list[bytes] = []
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(self._timeout)
                sock.connect(path)
                sock.sendall(line.encode() + b"\n")
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError
                    sock.settimeout(remaining)
                    data = sock.recv(65536)
                    if not data:
                        break
                    chunks.append(data)
        except TimeoutError:
            raise PoolerError(f"HAProxy stats socket {path}: no complete answer to {line!r} "
                              f"within {self._timeout:g}s") from None
        except OSError as e:
            raise PoolerError(f"HAProxy stats socket {path} unreachable: {e.strerror or e}") from e
        return b"".join(chunks).decode("utf-8", errors="replace")

    def server_states(self) -> dict[str, ServerState]:
        """The state of every mapped server, keyed by member name."""
        answer = self.command(f"show servers state {self._backend}")
        try:
            states = parse_servers_state(answer)
        except ValueError as e:
            raise PoolerError(f"HAProxy backend {self._backend!r} not readable via {self._socket}: {e}") from None
        missing = sorted(server for server in self._servers.values() if server not in states)
        if missing:
            raise PoolerError(f"HAProxy backend {self._backend!r} (socket {self._socket}) has no server(s) "
                              f"{', '.join(missing)}")
        return {member: states[server] for member, server in self._servers.items()}

    def _set_state(self, member: str, state: AdminCommand) -> None:
        target = f"{self._backend}/{self._servers[member]}"
        answer = self.command(f"set server {target} state {state}").strip()
        if answer:
            raise PoolerError(f"HAProxy refused 'set server {target} state {state}' "
                              f"(socket {self._socket}): {' '.join(answer.split())}")
        log.info("HAProxy server %s (%s) set to %s", target, member, state)

    # -- Pooler protocol ---------------------------------------------------------------------

    def routes_for(self, members: frozenset[str], current: frozenset[str] | None) -> frozenset[str]:
        wanted = members & self._servers.keys()  # members with no server mapped are ignored
        if not wanted:
            # Never an empty backend (every read would fail): the servers stay as they are.
            return current if current is not None else wanted
        return wanted

    def read_pool(self) -> frozenset[str]:
        return frozenset(m for m, s in self.server_states().items() if s.in_rotation)

    def apply_pool(self, members: frozenset[str]) -> None:
        for name in sorted(members - self._servers.keys()):
            if name not in self._warned:
                self._warned.add(name)
                log.warning("HAProxy backend %s has no server mapped to member %r; ignoring it",
                            self._backend, name)
        wanted = frozenset(members & self._servers.keys())
        if not wanted:
            # ProxySQL empties its reader hostgroup when every replica lags, and reads then
            # fail; a lagging replica still answers. Keep the backend as it is.
            if "(empty)" not in self._warned:
                self._warned.add("(empty)")
                log.warning("no member left for HAProxy backend %s: leaving its servers as they are rather than "
                            "putting all in %s (map 'primary' and set fallback_to_primary to route reads there)",
                            self._backend, self._ejected)
            return
        before = self.server_states()
        to_ready = sorted(m for m, s in before.items() if m in wanted and not s.in_rotation)
        to_eject = sorted(m for m, s in before.items() if m not in wanted and s.in_rotation)
        if not to_ready and not to_eject:
            return
        done: list[str] = []
        try:
            # Add before removing, so the backend is never emptier than either end state.
            for member in to_ready:
                self._set_state(member, "ready")
                done.append(member)
            for member in to_eject:
                self._set_state(member, self._ejected)
                done.append(member)
            self._verify(wanted)
        except PoolerError as e:
            raise PoolerError(f"{e}; {self._roll_back(done, before)}") from e

    def _verify(self, wanted: frozenset[str]) -> None:
        deadline = time.monotonic() + min(self._timeout, _VERIFY_SETTLE)
        while True:
            got = self.read_pool()
            if got == wanted:
                return
            if time.monotonic() >= deadline:
                raise PoolerError(f"HAProxy backend {self._backend!r} routes to {sorted(got)} after apply, "
                                  f"wanted {sorted(wanted)}")
            time.sleep(0.05)

    def _roll_back(self, done: list[str], before: Mapping[str, ServerState]) -> str:
        """Best effort: put the servers changed so far back in their previous admin state."""
        if not done:
            return "nothing was changed"
        failed: list[str] = []
        for member in reversed(done):
            previous = before[member]
            state: AdminCommand | None
            if previous.in_rotation:
                state = "ready"
            elif previous.admin_state & ADMF_FMAINT:
                state = "maint"
            elif previous.admin_state & ADMF_FDRAIN:
                state = "drain"
            else:
                state = None  # out by inheritance or resolution: "ready" could not have changed that
            if state is None:
                continue
            try:
                self._set_state(member, state)
            except PoolerError as e:
                log.error("HAProxy rollback of %s failed: %s", member, e)
                failed.append(member)
        if failed:
            return f"rollback failed for {', '.join(failed)}"
        return f"rolled back {', '.join(done)}"
