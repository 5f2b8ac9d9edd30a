"""The WAL generation room (rooms/wal.py), pure: its SQL by major, parser, and what it
exports and shows per primary."""

from __future__ import annotations

import pytest
from lagwatch.config.options import ClusterOptions
from lagwatch.estimate.snapshot import ClusterSnapshot, Snapshot
from lagwatch.render.text import render_text
from lagwatch.rooms import wal
from lagwatch.rooms.base import Cycle
from lagwatch.rooms.wal import ROOM, WalStats
from lagwatch.serve.export import families
from lagwatch.serve.status import cluster_status
from lagwatch.serve.status_page import render


def at(now: float) -> Cycle:
    """A cycle ending at ``now`` (what the room's keeper knows of its cluster besides its readings)."""
    return Cycle(now, ClusterOptions(name="main"), "primary")


def test_versioned_sql() -> None:
    assert "pg_stat_wal" not in (wal.VIEW.sql_for(130000) or "")  # 14+
    assert "wal_write::float8" in (wal.VIEW.sql_for(170000) or "")
    assert "NULL::float8 AS wal_write" in (wal.VIEW.sql_for(180000) or "")  # moved to pg_stat_io


@pytest.mark.parametrize("setting,method", [("on", "pglz"), ("off", "off"), ("lz4", "lz4"), ("zstd", "zstd"),
                                            ("pglz", "pglz")])
def test_wal_compression_boolean_before_15(setting: str, method: str) -> None:
    assert wal.compression_method(setting) == method


def test_wal_stats_18_has_no_write_sync_and_unlimited_keep() -> None:
    stats = wal.parse([{"wal_compression": "lz4", "max_slot_wal_keep_bytes": -1.0,
                        "wal_records": 10.0, "wal_fpi": 2.0, "wal_bytes": 4096.0, "wal_buffers_full": 0.0,
                        "wal_write": None, "wal_sync": None}])
    assert stats.max_slot_wal_keep_bytes is None and stats.writes is None and stats.fpi == 2


def snapshot_with(by_node: dict[str, WalStats] | None) -> Snapshot:
    cluster = ClusterSnapshot(name="main", primary_lsn=None, wal_rate_bytes_per_second=None, replicas=(),
                              walinspect=None, nodes=(), rooms={} if by_node is None else {"wal": by_node})
    return Snapshot(1.0, 0.01, 1, 0, (cluster,), interval=1.0, effective_interval=1.0)


def test_exported_and_shown_per_primary_and_absent_where_not_read() -> None:
    keeper = ROOM.keeper()  # the room's own keeper
    assert keeper.update({}, at(1.0)) is None
    pg17 = WalStats("lz4", 1 << 30, records=10, fpi=2, bytes=4096, buffers_full=0, writes=7, syncs=3)
    pg18 = WalStats("off", None, records=5, fpi=0, bytes=512, buffers_full=1, writes=None, syncs=None)
    by_node = keeper.update({"primary": pg17, "old": pg18}, at(2.0))
    assert list(by_node or ()) == ["old", "primary"]
    text = render_text(families(snapshot_with(dict(by_node or {})))).decode()
    for line in ('lagwatch_wal_compression_info{cluster="main",node="primary",method="lz4"} 1.0',
                 'lagwatch_max_slot_wal_keep_size_bytes{cluster="main",node="primary"} 1073741824.0',
                 'lagwatch_wal_bytes_total{cluster="main",node="primary"} 4096',
                 'lagwatch_wal_writes_total{cluster="main",node="primary"} 7',
                 'lagwatch_wal_bytes_total{cluster="main",node="old"} 512',
                 'lagwatch_wal_compression_info{cluster="main",node="old",method="off"} 1.0'):
        assert line in text, line
    # Unlimited: no setting series; 18: no write/sync counters (moved to pg_stat_io), not 0.
    assert 'lagwatch_max_slot_wal_keep_size_bytes{cluster="main",node="old"}' not in text
    assert 'lagwatch_wal_writes_total{cluster="main",node="old"}' not in text
    (old, primary) = cluster_status(snapshot_with(dict(by_node or {})).clusters[0])["wal"]
    assert (old["node"], old["compression"], primary["bytes"]) == ("old", "off", 4096)
    assert "primary: wal_compression lz4, max_slot_wal_keep_size 1024 MiB" in render(snapshot_with({"primary": pg17}))
    assert cluster_status(snapshot_with(None).clusters[0])["wal"] is None
    assert "lagwatch_wal_bytes_total{" not in render_text(families(snapshot_with(None))).decode()
