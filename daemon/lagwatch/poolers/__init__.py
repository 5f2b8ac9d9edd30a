"""Pooler adapters, one module each, chosen by the config's ``pooler.kind``."""

from __future__ import annotations

from lagwatch.config import (
    ClusterConfig,
    CommandPoolerConfig,
    HAProxyPoolerConfig,
    PgBouncerPoolerConfig,
    TomlPoolerConfig,
)
from lagwatch.poolers.base import Pooler, PoolerError, backends_from_cluster

__all__ = ["Pooler", "PoolerError", "make_pooler"]


def make_pooler(cluster: ClusterConfig) -> Pooler:
    """The adapter for the cluster's ``pooler`` config (kinds are checked at config load)."""
    config = cluster.pooler
    backends = backends_from_cluster(cluster)
    if isinstance(config, PgBouncerPoolerConfig):
        from lagwatch.poolers.pgbouncer import PgBouncerPooler

        return PgBouncerPooler(config, backends)
    if isinstance(config, HAProxyPoolerConfig):
        from lagwatch.poolers.haproxy import HAProxyPooler

        return HAProxyPooler(config)
    if isinstance(config, TomlPoolerConfig):
        from lagwatch.poolers.toml_pool import TomlPooler

        return TomlPooler(config, backends)
    if isinstance(config, CommandPoolerConfig):
        from lagwatch.poolers.command import CommandPooler

        return CommandPooler(config, backends)
    raise ValueError(f"cluster {cluster.name} has no pooler")
