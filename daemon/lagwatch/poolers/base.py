"""What every pooler adapter is: read the current read pool, make it match, verify.

Members are lagwatch node names: replica names from the config, and ``"primary"`` when
the primary is added as a fallback. Each adapter maps them to its own notion (hosts in a
PgBouncer entry, HAProxy servers, TOML server entries...). Adapters are synchronous and
do blocking I/O; the daemon runs them in a worker thread, one call at a time per cluster.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psycopg.conninfo

from lagwatch.config import ClusterConfig, NodeConfig

PRIMARY = "primary"


class PoolerError(Exception):
    """An apply or read that failed; the message says what and where (never a password)."""


@dataclass(frozen=True)
class Backend:
    """One member the pooler can route reads to."""

    name: str  # lagwatch node name ("replica1", "primary")
    host: str
    port: int | None


class Pooler(Protocol):
    kind: str

    def read_pool(self) -> frozenset[str]:
        """The members the pooler routes reads to right now (raise PoolerError if unknown)."""

    def apply_pool(self, members: frozenset[str]) -> None:
        """Make the pooler route reads to exactly ``members``, then read back and raise
        PoolerError unless it does. A failure must leave the previous config in place."""

    def routes_for(self, members: frozenset[str], current: frozenset[str] | None) -> frozenset[str]:
        """What ``read_pool`` will say once ``members`` is applied, given what it says now
        (``None``: unknown). Usually ``members``; an adapter that cannot route to exactly
        that (no empty PgBouncer entry, an unmapped HAProxy server) says what it does
        instead, so that lagwatch does not re-apply the same pool every cycle."""




def backends_from_cluster(cluster: ClusterConfig) -> dict[str, Backend]:
    """Host and port of every member the pool may hold, from the nodes' DSNs."""
    out = {}
    nodes: list[tuple[str, NodeConfig]] = [(PRIMARY, cluster.primary)]
    nodes += [(r.name, r) for r in cluster.replicas]
    for name, node in nodes:
        params = psycopg.conninfo.conninfo_to_dict(node.dsn)
        host = str(params.get("host") or params.get("hostaddr") or "localhost")
        port = params.get("port")
        out[name] = Backend(name=name, host=host, port=int(str(port)) if port else None)
    return out


def write_atomically(path: Path, text: str) -> None:
    """Write to a temp file beside ``path``, fsync, rename, fsync the directory: readers see
    the old file or the new one, never a partial one. Keeps the old file's mode, and its
    owner and group where this process may set them (root, or a group it belongs to), so
    a pooler that reads the file as another user still can."""
    directory = path.parent
    old = path.stat() if path.exists() else None
    mode = old.st_mode & 0o777 if old is not None else 0o644
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if old is not None:
            with contextlib.suppress(PermissionError):
                os.chown(tmp_name, old.st_uid if os.geteuid() == 0 else -1, old.st_gid)
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
