"""WAL archiving (rooms/archiver.py) on a real primary with a real archive_command: one that
fails and then succeeds, and one that is slow. The shared test cluster archives from the
start through a command the test steers by flag files (chaoscluster.py); each WAL segment
is closed by the test with pg_switch_wal(), which also wakes an archiver waiting out its
retry, so what lagwatch reads is checked against what the test did: which file, how many,
since when. The replicas, cloned with archive_mode on, do not archive and are not read.
What is read does not depend on the version (13+; each major's SQL is the same): one
version runs it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chaoscluster import ChaosCluster
from harness import Lagwatch, cluster_config
from lagwatch.demo.ports import free_port

pytestmark = pytest.mark.one_pg_version

INTERVAL = 0.2  # lagwatch's; a reading's ages are as of its poll, up to one interval old
AGE_TOLERANCE = INTERVAL + 0.3  # and the poll's own time, on a busy host
# pg_ls_archive_statusdir() gives a file's time in whole seconds (its st_mtime, truncated):
# the oldest segment's wait reads up to a second more than it waited, never less.
MTIME_RESOLUTION = 1.0


def waited_as_read(reported: float, ready_at: float) -> bool:
    """A wait lagwatch read against the test's own clock: never less than it waited, but
    for the reading's age, and no more than the resolution of the file's time above it."""
    elapsed = time.monotonic() - ready_at
    return -AGE_TOLERANCE < reported - elapsed <= MTIME_RESOLUTION + 0.05


@pytest.fixture
def lagwatch(pg_cluster: ChaosCluster, tmp_path: Path) -> Iterator[Lagwatch]:
    with Lagwatch(tmp_path, cluster_config(pg_cluster, free_port(["127.0.0.1"]), interval=f"{INTERVAL}s")) as lw:
        lw.wait_ready()
        lw.wait_for("the archiver read", lambda: archiving(lw) is not None, timeout=10)
        yield lw


def archiving(lw: Lagwatch) -> dict[str, Any] | None:
    """The primary's entry in /api/status's archiver (None before a read)."""
    nodes = lw.status()["clusters"][0]["archiver"]
    return None if nodes is None else next((n for n in nodes if n["node"] == "primary"), None)


def close_segment(pg_cluster: ChaosCluster) -> tuple[str, float]:
    """Write a little WAL, close its segment: the file that becomes ready to archive, and
    when (the test's clock)."""
    primary = pg_cluster.primary
    primary.execute("CREATE TABLE IF NOT EXISTS archive_probe (at timestamptz)")
    primary.execute("INSERT INTO archive_probe VALUES (clock_timestamp())")
    name = str(primary.scalar("SELECT pg_walfile_name(pg_switch_wal())"))
    return name, time.monotonic()


def test_a_failing_command_is_counted_waits_and_recovers(pg_cluster: ChaosCluster, lagwatch: Lagwatch) -> None:
    lw = lagwatch
    # Only the primary archives: the replicas (archive_mode on, not always) are not read.
    assert [n["node"] for n in lw.status()["clusters"][0]["archiver"]] == ["primary"]
    assert lw.value("lagwatch_archive_archived_total", node="replica1") is None
    first, _ = close_segment(pg_cluster)
    lw.wait_for(f"{first} archived", lambda: (archiving(lw) or {})["last_archived_wal"] == first, timeout=15)
    before = archiving(lw)
    assert before is not None and before["waiting_segments"] == 0 and before["failing"] is False
    assert before["configured"] is True and before["archive_mode"] == "on"

    (pg_cluster.archive_flags / "fail").touch()
    failed, ready_at = close_segment(pg_cluster)
    lw.wait_for("the failure counted", lambda: (archiving(lw) or {})["failed_total"] > before["failed_total"],
                timeout=15)
    now = archiving(lw)
    assert now is not None
    assert (now["last_failed_wal"], now["waiting_segments"], now["failing"]) == (failed, 1, True)
    assert now["archived_total"] == before["archived_total"]
    # The oldest waiting segment has waited since the test closed it (the server's clock).
    assert waited_as_read(now["oldest_waiting_age_seconds"], ready_at), now
    assert lw.value("lagwatch_archive_waiting_segments", node="primary") == 1
    assert "failing: " + failed in lw.get("/status")[1]
    more = [close_segment(pg_cluster)[0] for _ in range(2)]
    lw.wait_for("three waiting", lambda: (archiving(lw) or {})["waiting_segments"] == 3, timeout=15)

    # Mended: the next segment wakes the archiver, and everything waiting goes.
    (pg_cluster.archive_flags / "fail").unlink()
    last, _ = close_segment(pg_cluster)
    lw.wait_for(f"{last} archived", lambda: (archiving(lw) or {})["last_archived_wal"] == last, timeout=15)
    after = archiving(lw)
    assert after is not None and (after["waiting_segments"], after["failing"]) == (0, False)
    assert after["archived_total"] - before["archived_total"] == 1 + len(more) + 1, (before, after, more)
    assert after["failed_total"] >= now["failed_total"]

    # Statistics reset: the counters carry on from where they were.
    pg_cluster.primary.execute("SELECT pg_stat_reset_shared('archiver')")
    lw.wait_cycles(3)
    assert pg_cluster.primary.scalar("SELECT archived_count FROM pg_stat_archiver") == 0
    reset = archiving(lw)
    assert reset is not None and reset["archived_total"] == after["archived_total"]
    assert reset["failed_total"] == after["failed_total"]


def test_a_slow_command_shows_its_queue_and_the_oldest_wait(pg_cluster: ChaosCluster, lagwatch: Lagwatch) -> None:
    lw = lagwatch
    start = archiving(lw)
    assert start is not None
    (pg_cluster.archive_flags / "delay").write_text("1.0")
    _, ready_at = close_segment(pg_cluster)
    close_segment(pg_cluster)
    # Both wait while the first takes its 1 s: the oldest's wait is the first's, on the test's clock.
    lw.wait_for("the queue seen", lambda: (archiving(lw) or {})["waiting_segments"] == 2, timeout=10)
    queued = archiving(lw)
    assert queued is not None and queued["failing"] is False
    assert waited_as_read(queued["oldest_waiting_age_seconds"], ready_at), queued
    lw.wait_for("the queue drained", lambda: (archiving(lw) or {})["waiting_segments"] == 0, timeout=15)
    (pg_cluster.archive_flags / "delay").unlink()
    # The archiver renames a segment's .ready to .done before it counts it in pg_stat_archiver:
    # a poll between the two sees the queue drained and the count one short (once, on a slow day).
    lw.wait_for("both counted", lambda: (archiving(lw) or {})["archived_total"] - start["archived_total"] == 2,
                timeout=10)
    done = archiving(lw)
    assert done is not None and done["archived_total"] - start["archived_total"] == 2
    assert done["failed_total"] == start["failed_total"]


def test_a_standby_with_archive_mode_always_archives_and_is_read(pg_cluster: ChaosCluster,
                                                                  lagwatch: Lagwatch) -> None:
    """archive_mode = always: the standby archives the WAL it receives (the same command),
    and lagwatch reads its archiver too, with its mode; set back to on, it is not read."""
    lw, replica1 = lagwatch, pg_cluster.replicas[0]

    def standby() -> dict[str, Any] | None:
        nodes = lw.status()["clusters"][0]["archiver"] or []
        return next((n for n in nodes if n["node"] == "replica1"), None)

    replica1.alter_system("archive_mode", "always")  # needs a restart
    replica1.restart()
    try:
        lw.wait_for("replica1 streaming", replica1.is_streaming, timeout=20)
        lw.wait_for("replica1's archiver read", lambda: standby() is not None, timeout=15)
        name, _ = close_segment(pg_cluster)
        lw.wait_for(f"{name} archived by the standby", lambda: (standby() or {}).get("last_archived_wal") == name,
                    timeout=15)
        read = standby()
        assert read is not None and (read["archive_mode"], read["failing"]) == ("always", False), read
        assert lw.value("lagwatch_archive_info", node="replica1", mode="always") == 1
    finally:
        replica1.alter_system("archive_mode", None)
        replica1.restart()
    lw.wait_for("replica1 streaming again", replica1.is_streaming, timeout=20)
    lw.wait_for("replica1 not read once it archives no more", lambda: standby() is None, timeout=15)
