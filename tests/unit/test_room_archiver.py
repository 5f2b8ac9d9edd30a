"""The WAL archiving room (rooms/archiver.py), pure: its SQL, parser, where it applies, its
counts across statistics resets, and what it exports and shows."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from lagwatch.config.options import ClusterOptions
from lagwatch.estimate.snapshot import ClusterSnapshot, Snapshot
from lagwatch.render.text import render_text
from lagwatch.rooms import archiver
from lagwatch.rooms.archiver import ArchiverKeeper, ArchiverReading, NodeArchiving
from lagwatch.rooms.base import Cycle
from lagwatch.serve.export import families
from lagwatch.serve.status import cluster_status
from lagwatch.serve.status_page import render
from lagwatch.views.probe import Capabilities


def at(now: float) -> Cycle:
    """A cycle ending at ``now`` (what the room's keeper knows of its cluster besides its readings)."""
    return Cycle(now, ClusterOptions(name="main"), "primary")


def row(**kw: Any) -> dict[str, Any]:
    out = {"mode": "on", "configured": True, "archived": 10, "failed": 0,
           "last_archived_wal": "000000010000000000000009", "last_archived_age": 3.5, "last_failed_wal": None,
           "last_failed_age": None, "stats_reset": 1000.0,
           "waiting": {"count": 0, "oldest_age": None}}
    out.update(kw)
    return out


def reading(**kw: Any) -> ArchiverReading:
    return archiver.parse([row(**kw)])


def test_parse_a_row_and_a_role_that_may_not_list_the_waiting_segments() -> None:
    r = reading(waiting={"count": 3, "oldest_age": 42.5}, failed=2, last_failed_wal="00000001000000000000000A",
                last_failed_age=1.0)
    assert (r.archived, r.failed, r.waiting, r.oldest_waiting_age, r.last_failed_wal) == (
        10, 2, 3, 42.5, "00000001000000000000000A")
    hidden = reading(waiting=None, configured=None)
    assert (hidden.waiting, hidden.oldest_waiting_age, hidden.unconfigured) == (None, None, False)
    assert reading(configured=False).unconfigured


@pytest.mark.parametrize(("mode", "in_recovery", "applies"), [
    ("on", False, True), ("always", False, True), ("off", False, False),
    ("on", True, False),  # a standby with archive_mode on does not archive: not read, never alerts
    ("always", True, True), (None, False, False)])
def test_it_applies_where_the_server_archives(mode: str | None, in_recovery: bool, applies: bool) -> None:
    caps = Capabilities(150000, in_recovery, False, False, True, asked={} if mode is None else
                        {"archive_mode": mode})
    assert archiver.VIEW.applies(caps) is applies


def test_every_version_reads_the_same_sql_and_the_statusdir_only_where_the_probe_found_it() -> None:
    def caps(version: int, granted: bool | None) -> Capabilities:
        asked: dict[str, Any] = {"archive_mode": "on"} | ({} if granted is None else {"archive_status": granted})
        return Capabilities(version, False, False, False, True, asked=asked)

    sql = archiver.VIEW.sql(caps(130000, True)) or ""
    assert sql == archiver.VIEW.sql(caps(180000, True))
    assert "FROM pg_ls_archive_statusdir() WHERE name LIKE '%.ready'" in sql and "last_archived_time" in sql
    # Still guarded where granted: a grant revoked while the connection lasts costs the
    # waiting segments (NULL), never the view and its failure counts.
    assert "CASE WHEN has_function_privilege('pg_ls_archive_statusdir()', 'EXECUTE')" in sql
    for denied in (caps(150000, False), caps(150000, None)):
        without = archiver.VIEW.sql(denied) or ""
        assert "pg_ls_archive_statusdir" not in without and "NULL::json AS waiting" in without


def test_counts_carry_across_statistics_resets() -> None:
    keeper = ArchiverKeeper()
    # (cycle's readings, archived_total, failed_total)
    table = [
        ({"archived": 10, "failed": 1}, 10, 1),
        ({"archived": 12, "failed": 3}, 12, 3),
        ({"archived": 0, "failed": 0, "stats_reset": 2000.0}, 12, 3),  # pg_stat_reset_shared('archiver')
        ({"archived": 2, "failed": 1, "stats_reset": 2000.0}, 14, 4),
        ({"archived": 1, "failed": 0, "stats_reset": 3000.0}, 15, 4),  # reset and archived between two reads
    ]
    for n, (kw, archived, failed) in enumerate(table):
        (node,) = keeper.update({"primary": reading(**kw)}, at(float(n))) or ()
        assert (node.archived_total, node.failed_total) == (archived, failed), n
    keeper.forget("primary")
    (node,) = keeper.update({"primary": reading(archived=5, failed=0, stats_reset=3000.0)}, at(9.0)) or ()
    assert node.archived_total == 5  # a node forgotten starts again
    assert keeper.update({}, at(10.0)) is None  # no node answered with the view: nothing to say


def snapshot_with(nodes: tuple[NodeArchiving, ...]) -> Snapshot:
    cluster = ClusterSnapshot(name="main", primary_lsn=None, wal_rate_bytes_per_second=None, replicas=(),
                              walinspect=None, nodes=(), rooms={"archiver": nodes})
    return Snapshot(1.0, 0.01, 1, 0, (cluster,), interval=1.0, effective_interval=1.0)


def test_exported_shown_and_said_as_failing_only_while_segments_wait() -> None:
    failing = reading(failed=4, last_failed_wal="00000001000000000000000A", last_failed_age=2.0,
                      last_archived_age=30.0, waiting={"count": 2, "oldest_age": 31.0})
    nodes = (NodeArchiving("primary", failing, 10, 4),)
    text = render_text(families(snapshot_with(nodes))).decode()
    for line in ('lagwatch_archive_archived_total{cluster="main",node="primary"} 10',
                 'lagwatch_archive_failed_total{cluster="main",node="primary"} 4',
                 'lagwatch_archive_waiting_segments{cluster="main",node="primary"} 2.0',
                 'lagwatch_archive_oldest_waiting_age_seconds{cluster="main",node="primary"} 31.0',
                 'lagwatch_archive_last_failure_age_seconds{cluster="main",node="primary"} 2.0',
                 'lagwatch_archive_unconfigured{cluster="main",node="primary"} 0.0',
                 'lagwatch_archive_info{cluster="main",node="primary",mode="on"} 1.0'):
        assert line in text, line
    (status,) = cluster_status(snapshot_with(nodes).clusters[0])["archiver"]
    assert (status["failing"], status["waiting_segments"], status["last_failed_wal"]) == (
        True, 2, "00000001000000000000000A")
    page = render(snapshot_with(nodes))
    assert "WAL archiving: primary: 10 archived, 4 failed, 2 waiting" in page and "failing: 0000000100" in page
    # Archived since the last failure, or nothing waiting: not failing.
    for r in (replace(failing, last_archived_age=1.0), replace(failing, waiting=0)):
        assert not archiver.failing(NodeArchiving("primary", r, 10, 4))
    unconfigured = replace(failing, configured=False, failed=0, last_failed_age=None)
    assert "nothing archives (no archive_command)" in render(snapshot_with((NodeArchiving("primary", unconfigured, 0,
                                                                                           0),)))
    assert cluster_status(replace(snapshot_with(()).clusters[0], rooms={}))["archiver"] is None


@pytest.mark.parametrize(("asked", "said"), [
    ({"archive_mode": "on", "archive_status": False}, True),
    ({"archive_mode": "on", "archive_status": True}, False),
    ({"archive_mode": "off", "archive_status": False}, False),  # nothing to read: nothing missing
])
def test_a_missing_grant_is_said_once_at_connect_with_the_statement_that_gives_it(
        asked: dict[str, Any], said: bool, caplog: pytest.LogCaptureFixture) -> None:
    from lagwatch.read.viewreader import ViewReader
    caps = Capabilities(150000, False, False, False, True, asked=asked)
    reader = ViewReader("main/primary")
    reader.new_connection("watcher")
    caplog.set_level("INFO", logger="lagwatch")
    reader.say_skipped(caps, "off")
    reader.say_skipped(caps, "off")  # once per reader, however often asked
    lines = [r.getMessage() for r in caplog.records if "archiver" in r.getMessage()]
    assert lines == (["main/primary: archiver: not reading the segments waiting to be archived "
                      "(pg_wal/archive_status): GRANT EXECUTE ON FUNCTION pg_ls_archive_statusdir() TO watcher"]
                     if said else [])


def test_a_polls_one_statement_carries_the_sql_the_probe_chose() -> None:
    """The combined statement (views/combined.py) is built per choice: a connection with the
    grant and one without get different statements, each built once."""
    from lagwatch.views.combined import combined_sql
    granted = Capabilities(160000, False, False, False, True,
                           asked={"archive_mode": "on", "archive_status": True})
    denied = replace(granted, asked={"archive_mode": "on", "archive_status": False})
    with_dir = combined_sql([archiver.VIEW], granted)
    without = combined_sql([archiver.VIEW], denied)
    assert b"pg_ls_archive_statusdir" in with_dir and b"pg_ls_archive_statusdir" not in without
    assert combined_sql([archiver.VIEW], granted) is with_dir
