"""Sharding a fleet by rendezvous hashing of cluster names (lagwatch.shard, Config.shard)."""

from __future__ import annotations

from collections import Counter

import pytest
from lagwatch.config import parse_config
from lagwatch.errors import ConfigError
from lagwatch.shard import shard_of

NAMES = [f"pg-{team}-{n:03d}" for team in ("billing", "search", "auth") for n in range(100)]


def test_shards_share_a_fleet_evenly() -> None:
    for count in (2, 3, 5):
        sizes = Counter(shard_of(name, count) for name in NAMES)
        assert set(sizes) == set(range(count))
        assert max(sizes.values()) <= 1.25 * len(NAMES) / count, sizes


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_one_shard_more_moves_only_what_the_new_shard_takes(count: int) -> None:
    moved = [name for name in NAMES if shard_of(name, count) != shard_of(name, count + 1)]
    assert all(shard_of(name, count + 1) == count for name in moved)  # never between old shards
    assert len(moved) <= 1.3 * len(NAMES) / (count + 1), len(moved)  # about 1/(count+1)


def test_a_sharded_config_watches_only_its_clusters() -> None:
    clusters = [{"name": name, "primary": {"dsn": "host=p"}, "replicas": [{"name": "r1", "dsn": "host=r"}]}
                for name in NAMES[:20]]
    shards = [parse_config({"shard": {"index": i, "count": 2}, "clusters": clusters}) for i in (0, 1)]
    owned = [{c.name for c in config.clusters_with_nodes} for config in shards]
    assert owned[0] | owned[1] == set(NAMES[:20]) and not owned[0] & owned[1]
    assert {c.name for c in parse_config({"clusters": clusters}).clusters_with_nodes} == set(NAMES[:20])
    with pytest.raises(ConfigError) as caught:
        parse_config({"shard": {"index": 2, "count": 2}, "clusters": clusters})
    assert any("shard" in p and "must be below count 2" in p for p in caught.value.problems), caught.value.problems
