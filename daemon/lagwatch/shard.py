"""Which instance of a fleet watches a cluster: rendezvous (highest-random-weight) hashing
of the cluster's name over ``count`` shards.

Each shard scores every cluster with a hash of (cluster name, shard index); the highest
score owns it. Every instance decides alone, from the name and the count, with no
coordination; changing ``count`` from n to n+1 moves only the clusters the new shard now
scores highest, about 1/(n+1) of them, and never moves one between two old shards.
Hand-written because it is ten lines on hashlib; a library would add a dependency for them.
"""

from __future__ import annotations

import hashlib


def _score(cluster: str, shard: int) -> int:
    digest = hashlib.sha256(f"{cluster}\0{shard}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def shard_of(cluster: str, count: int) -> int:
    """The shard (0 .. count-1) that owns ``cluster``."""
    return max(range(count), key=lambda shard: (_score(cluster, shard), -shard))
