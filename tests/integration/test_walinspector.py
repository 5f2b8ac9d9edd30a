"""The WAL inspector (read/walinspector.py) on a real primary, driven directly: where each
inspection starts and ends, what it counts against pg_walinspect read by the test itself
(the oracle: pg_get_wal_stats over the same range), its byte bound (the rest skipped and
counted, never read late), its pace on the clock passed in, and a refused grant
said once and never read as the node's failure. The daemon's use of it end to end:
test_wal_compression.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from chaoscluster import ChaosCluster
from lagwatch import rooms
from lagwatch.config import parse_config
from lagwatch.lsn import format_lsn
from lagwatch.read.walinspector import WALINSPECT_EVERY, WalInspector
from lagwatch.views import probe
from lagwatch.views.probe import Capabilities
from lagwatch.views.walinspect import WalInspection
from psycopg.rows import dict_row

pytestmark = pytest.mark.newest_pg_version  # pg_get_wal_block_info (what compression saved) is 16+


def cluster_config(max_bytes: int = 16 << 20) -> Any:
    return parse_config({"clusters": [{"name": "main", "primary": {"dsn": "host=p"},
                                       "walinspect_max_bytes": max_bytes}]}).clusters[0]


@pytest.fixture
def primary(pg_cluster: ChaosCluster) -> Iterator[ChaosCluster]:
    pg_cluster.primary.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    pg_cluster.primary.execute("CREATE TABLE IF NOT EXISTS lw_inspect (id int, pad text)")
    yield pg_cluster
    pg_cluster.primary.execute("DROP TABLE IF EXISTS lw_inspect")


async def inspect(dsn: str, inspector: WalInspector, cluster: Any, failures: list[tuple[str, str]], now: float,
                  caps: Capabilities | None = None) -> tuple[WalInspection | None, int, Capabilities]:
    """One inspection as a poller runs it at lagwatch's time ``now``, on a connection of its
    own; the primary's position as of it (the poll's ``current``)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        if caps is None:
            caps = probe.parse(await (await conn.execute(probe.sql(rooms.probe_columns()))).fetchall())
        cur = await conn.execute("SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
                                 "ELSE pg_current_wal_lsn() END - '0/0')::bigint AS lsn")
        row = await cur.fetchone()
        assert row is not None
        current = int(row["lsn"])
        inspection = await inspector.inspect(conn, caps, current, cluster, True, lambda view: False,
                                             lambda view, error: failures.append((view, error)), 5.0, now)
        return inspection, current, caps


def oracle(c: ChaosCluster, start: int, end: int) -> tuple[int, int, int]:
    """pg_walinspect's own count of the records in [start, end): records, bytes, FPI bytes."""
    row = c.primary.execute("SELECT coalesce(sum(count), 0)::bigint, coalesce(sum(record_size), 0)::bigint, "
                            "coalesce(sum(fpi_size), 0)::bigint FROM pg_get_wal_stats(%s, %s, false)",
                            (format_lsn(start), format_lsn(end)))
    ((records, record_bytes, fpi_bytes),) = row
    return int(records), int(record_bytes), int(fpi_bytes)


def write_wal(c: ChaosCluster, rows: int) -> None:
    c.primary.execute("CHECKPOINT")  # the next change to each page is a full-page image
    c.primary.execute(f"INSERT INTO lw_inspect SELECT g, repeat('x', 200) FROM generate_series(1, {rows}) g")
    c.primary.execute("UPDATE lw_inspect SET id = id + 1")


def test_inspections_follow_each_other_and_count_what_pg_walinspect_counts(primary: ChaosCluster) -> None:
    dsn, cluster, failures = primary.primary.dsn(), cluster_config(), []
    inspector = WalInspector(interval=1.0, now=0.0)
    first, _, _ = asyncio.run(inspect(dsn, inspector, cluster, failures, now=0.0))
    assert first is None  # the first call only says where the next starts: the present
    ranges = []
    for now in (1.0, 1.0 + WALINSPECT_EVERY):
        write_wal(primary, 2_000)
        if ranges:  # one inspection each WALINSPECT_EVERY seconds at most: not due a second before
            assert asyncio.run(inspect(dsn, inspector, cluster, failures, now=now - 1.0))[0] is None
        inspection, _, caps = asyncio.run(inspect(dsn, inspector, cluster, failures, now=now))
        assert inspection is not None and inspector.state is True, failures
        ranges.append((inspection.start_lsn, inspection.end_lsn))
        # Up to the flush position it read itself, not the ``current`` read before it:
        # autovacuum's commits on the table just written may land between the two reads
        # (4 kB past, once, on a host busy with both workers).
        assert inspection.end_lsn <= inspection.flush_lsn and inspection.fpi_bytes > 0
        assert (inspection.records, inspection.record_bytes, inspection.fpi_bytes) == oracle(
            primary, inspection.start_lsn, inspection.end_lsn)
        # What compression saved is measured over the same range (16+, the grant held).
        assert caps.can_walinspect_blocks and inspection.compressed is not None
    # Each starts where the last left off: every record counted once, none skipped.
    assert ranges[1][0] == ranges[0][1], [tuple(map(format_lsn, r)) for r in ranges]
    assert failures == []


def test_an_inspection_reads_at_most_its_bound_a_cycle(primary: ChaosCluster) -> None:
    dsn, cluster, failures = primary.primary.dsn(), cluster_config(max_bytes=64 << 10), []
    inspector = WalInspector(interval=1.0, now=0.0)
    asyncio.run(inspect(dsn, inspector, cluster, failures, now=0.0))
    write_wal(primary, 20_000)  # megabytes of WAL, against 64 kB a cycle
    inspection, _, _ = asyncio.run(inspect(dsn, inspector, cluster, failures, now=1.0))
    assert inspection is not None, failures
    assert 0 < inspection.inspected_bytes <= 64 << 10 < inspection.skipped_bytes  # one cycle's bound
    assert inspection.end_lsn < inspection.flush_lsn  # (the flush it read, not the position read before it)
    # The rest is skipped (and counted), never read late: the next starts at the present of
    # the last, and may read as many cycles' bytes as have passed since (WALINSPECT_EVERY).
    write_wal(primary, 20_000)
    nxt, _, _ = asyncio.run(inspect(dsn, inspector, cluster, failures, now=1.0 + WALINSPECT_EVERY))
    assert nxt is not None and nxt.start_lsn == inspection.flush_lsn
    assert 64 << 10 < nxt.inspected_bytes <= WALINSPECT_EVERY * (64 << 10)


def test_a_refused_grant_is_said_as_the_views_failure_never_the_nodes(primary: ChaosCluster) -> None:
    p = primary.primary
    p.execute("DROP ROLE IF EXISTS lw_noinspect")
    p.execute("CREATE ROLE lw_noinspect LOGIN")
    try:
        dsn, cluster, failures = p.dsn(user="lw_noinspect"), cluster_config(), []
        inspector = WalInspector(interval=1.0, now=0.0)
        _, _, caps = asyncio.run(inspect(dsn, inspector, cluster, failures, now=0.0))
        assert not caps.can_walinspect and inspector.state is False  # the probe saw it: not even tried
        # A probe that found the grant, taken away since: the statement is refused, said as the
        # view's failure (the poller rests the view), and the call returns normally.
        granted = Capabilities(caps.version_num, False, True, True, caps.can_read_all_stats)
        inspector = WalInspector(interval=1.0, now=0.0)
        asyncio.run(inspect(dsn, inspector, cluster, failures, 0.0, granted))
        write_wal(primary, 100)
        inspection, _, _ = asyncio.run(inspect(dsn, inspector, cluster, failures, 1.0, granted))
        assert inspection is None and inspector.state is False
        assert [view for view, _ in failures] == ["walinspect"] and "permission denied" in failures[0][1], failures
    finally:
        p.execute("DROP ROLE IF EXISTS lw_noinspect")


def test_a_standby_or_walinspect_off_is_not_inspected(primary: ChaosCluster) -> None:
    failures: list[tuple[str, str]] = []
    dsn, cluster = primary.primary.dsn(), cluster_config()

    def primed() -> WalInspector:
        """An inspector that has inspected (state True) and would inspect again: due, WAL since."""
        inspector = WalInspector(interval=1.0, now=0.0)
        asyncio.run(inspect(dsn, inspector, cluster, failures, now=0.0))
        write_wal(primary, 100)
        assert asyncio.run(inspect(dsn, inspector, cluster, failures, now=1.0))[0] is not None
        write_wal(primary, 100)
        assert inspector.state is True
        return inspector

    inspector = primed()
    inspection, _, caps = asyncio.run(inspect(primary.replicas[0].dsn(), inspector, cluster, failures,
                                              now=1.0 + WALINSPECT_EVERY))
    assert caps.in_recovery and inspection is None and inspector.state is None  # a standby: not a view of it
    off = parse_config({"clusters": [{"name": "main", "primary": {"dsn": "host=p"},
                                      "walinspect": "off"}]}).clusters[0]
    inspector = primed()
    inspection, _, _ = asyncio.run(inspect(dsn, inspector, off, failures, now=1.0 + WALINSPECT_EVERY))
    assert inspection is None and inspector.state is None and failures == []
