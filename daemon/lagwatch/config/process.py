"""The lagwatch process's own sections of the config, beside its clusters: which part of a
fleet this instance watches (``shard``) and its HTTP server's limits (``http``)."""

from __future__ import annotations

from pydantic import Field, model_validator

from lagwatch.config.base import PositiveDuration, _Strict
from lagwatch.shard import shard_of


class ShardConfig(_Strict):
    """This instance's part of a fleet: clusters are spread over ``count`` shards by
    rendezvous hashing of their names (lagwatch.shard); run two instances per index for HA
    (the per-cluster leader lock decides which one acts on the pool)."""

    index: int = Field(ge=0)
    count: int = Field(ge=1, le=1024)

    @model_validator(mode="after")
    def _index_in_range(self) -> ShardConfig:
        if self.index >= self.count:
            raise ValueError(f"index {self.index} must be below count {self.count} (shards are 0 .. count-1)")
        return self

    def owns(self, cluster: str) -> bool:
        return shard_of(cluster, self.count) == self.index


class HttpConfig(_Strict):
    """The HTTP server's limits against slow or numerous clients (see httpserver.py)."""

    max_connections: int = Field(default=512, ge=1, le=100_000)  # also kept below the descriptor limit
    request_timeout: PositiveDuration = 10.0  # to read a whole request's headers, TLS handshake included
    idle_timeout: PositiveDuration = 60.0  # a kept-alive connection between two requests
