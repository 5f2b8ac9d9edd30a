"""Pooler adapters, one module each, chosen by the config's ``pooler.kind`` from ``KINDS``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from lagwatch.config import ClusterConfig
from lagwatch.poolers.base import Backend, Pooler, PoolerError, backends_from_cluster
from lagwatch.poolers.command import CommandPooler
from lagwatch.poolers.haproxy import HAProxyPooler
from lagwatch.poolers.pgbouncer import PgBouncerPooler

__all__ = ["KINDS", "Pooler", "PoolerError", "make_pooler"]


def _imported_when_made(module: str) -> Callable[[Any, Mapping[str, Backend]], Pooler]:
    """The TOML poolers' modules are imported when one is made: they bring tomlkit (~1.4 MB
    resident), which a daemon without such a pooler never needs."""
    def make(config: Any, backends: Mapping[str, Backend]) -> Pooler:
        pooler: Callable[[Any, Mapping[str, Backend]], Pooler] = importlib.import_module(
            f"lagwatch.poolers.{module}").pooler
        return pooler(config, backends)

    return make


# kind -> adapter(pooler config, the members' addresses); the config's schema has one
# pooler config class per kind, checked when the config is loaded.
KINDS: Mapping[str, Callable[[Any, Mapping[str, Backend]], Pooler]] = {
    "pgbouncer": PgBouncerPooler,
    "haproxy": lambda config, _backends: HAProxyPooler(config),  # maps members to its own server names
    "pgcat": _imported_when_made("pgcat"),
    "pgdog": _imported_when_made("pgdog"),
    "command": CommandPooler,
}


def make_pooler(cluster: ClusterConfig) -> Pooler:
    """The adapter for the cluster's ``pooler`` config."""
    if cluster.pooler is None:
        raise ValueError(f"cluster {cluster.name} has no pooler")
    return KINDS[cluster.pooler.kind](cluster.pooler, backends_from_cluster(cluster))
