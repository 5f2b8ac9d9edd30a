"""Free TCP ports on loopback addresses, for the demo's servers and the tests'."""

from __future__ import annotations

import socket
from collections.abc import Collection, Sequence


def port_free(host: str, port: int) -> bool:
    # No SO_REUSEADDR: also rejects ports held by a wildcard listener or in TIME_WAIT.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(hosts: Sequence[str], *, exclude: Collection[int] = ()) -> int:
    """A TCP port currently free on all the given loopback addresses."""
    if not hosts:
        raise ValueError("free_port needs at least one host")
    for _ in range(500):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((hosts[0], 0))
            port: int = s.getsockname()[1]
        if port not in exclude and all(port_free(h, port) for h in hosts):
            return port
    raise RuntimeError(f"no TCP port free on all of {list(hosts)}")
