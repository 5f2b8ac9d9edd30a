"""What every pooler adapter is: read the current read pool, make it match, verify.

Members are lagwatch node names: replica names from the config, and ``"primary"`` when
the primary is added as a fallback. Each adapter maps them to its own notion (hosts in a
PgBouncer entry, HAProxy servers, TOML server entries...). Adapters are synchronous and
do blocking I/O; the daemon runs them in a worker thread, one call at a time per cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import psycopg.conninfo

from lagwatch.config import ClusterConfig, NodeConfig

PRIMARY = "primary"


class PoolerError(Exception):
    """An apply or read that failed; the message says what and where (never a password)."""


class NeverAppliedError(PoolerError):
    """The pool cannot be read back because lagwatch has never applied one here (a fresh
    start of a ``command`` pooler): unknown, but nothing has failed."""


@dataclass(frozen=True)
class Backend:
    """One member the pooler can route reads to."""

    name: str  # lagwatch node name ("replica1", "primary")
    host: str
    port: int | None


# How often lagwatch reads a pooler's own view back between its changes (seconds; each read
# comes after a random 50-100 % of it, so a fleet's reads are spread), so that a hand edit
# is seen: state in a file lagwatch wrote survives the pooler's restart, and a read costs a
# thread. HAProxy's runtime state does not survive one: its adapter reads far more often.
READ_BACK_EVERY = 30.0


class Pooler(Protocol):
    kind: str
    read_back_every: float  # seconds between read-backs of the pooler's own view (READ_BACK_EVERY)

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
        if "," in host or "," in str(port or ""):
            # A primary DSN that finds the writer among several hosts has no one address:
            # never routed to (the config allows one only when the pool cannot hold it).
            continue
        out[name] = Backend(name=name, host=host, port=int(str(port)) if port else None)
    return out
