"""What a poll costs the servers where a view does not apply or is not due, counted by the
servers themselves: lagwatch's role logs every statement it runs (``log_statement = 'all'``
set on the role), and the test reads each server's log.

A primary without subscriptions and a 17+ replica without slot sync: each poll is one
statement; the views read one poll in ten (views/base.py: the vacuum horizon's and the
subscriptions' on the primary, the slot sync's and the startup process's reads on the
replica) are in it on the connection's first poll and every tenth after, and not at all on
the others (no ``set_config()`` tick, no clause); the slot sync's copies are not read where
``sync_replication_slots`` is off (the server's own plan says their scan never ran). The
newest version runs it: slot sync is 17+.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from chaoscluster import ChaosCluster
from harness import Lagwatch, cluster_config
from lagwatch.demo.ports import free_port
from lagwatch.demo.servers import LocalServer
from lagwatch.read.conninfo import poller_application_name
from lagwatch.rooms import slotsync

pytestmark = pytest.mark.newest_pg_version

ROLE = "lw_cadence"
POLLS = 25  # polls read per node: the cadence's reads at 0, 10 and 20
# A log entry: "2026-11-27 21:00:00.123 UTC [12345] LOG:  execute lagwatch_cycle_0: SELECT ..."
ENTRY = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \w+ \[(\d+)\] ", re.M)


@pytest.fixture
def counted_role(pg_cluster: ChaosCluster) -> Iterator[str]:
    """A login role whose every statement the servers log (replicated to the replicas)."""
    pg_cluster.primary.execute(f"CREATE ROLE {ROLE} LOGIN SUPERUSER")
    pg_cluster.primary.execute(f"ALTER ROLE {ROLE} SET log_statement = 'all'")
    try:
        yield ROLE
    finally:
        pg_cluster.primary.execute(f"DROP ROLE IF EXISTS {ROLE}")


def statements(server: LocalServer, offset: int, pid: int) -> list[str]:
    """The statements session ``pid`` ran, as the server logged them after ``offset``."""
    text = server.log_file.read_bytes()[offset:].decode(errors="replace")
    starts = list(ENTRY.finditer(text))
    out = []
    for m, nxt in zip(starts, [*starts[1:], None], strict=True):
        body = text[m.end():nxt.start() if nxt is not None else len(text)]
        if int(m.group(1)) == pid and re.match(r"LOG:\s+(statement|execute)", body):
            out.append(body)
    return out


def session_pid(server: LocalServer, node: str) -> int:
    rows = server.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                          (poller_application_name("main", node),))
    assert len(rows) == 1, rows
    return int(rows[0][0])


def test_a_view_that_does_not_apply_or_is_not_due_costs_the_poll_nothing(
        pg_cluster: ChaosCluster, counted_role: str, tmp_path: Path) -> None:
    primary, replica = pg_cluster.primary, pg_cluster.replicas[0]
    assert replica.execute("SHOW sync_replication_slots") == [("off",)]
    assert primary.execute("SELECT count(*) FROM pg_subscription") == [(0,)]
    offsets = {s.name: s.log_file.stat().st_size for s in (primary, replica)}
    config = cluster_config(pg_cluster, free_port(["127.0.0.1"]), interval="100ms", replicas=[replica.name])
    main = config["clusters"][0]
    main["primary"]["dsn"] = primary.dsn(user=counted_role)
    main["replicas"][0]["dsn"] = replica.dsn(user=counted_role)
    # Only the views: no WAL inspection or dating reads after the primary's answer.
    main["lag_from_wal"] = main["walinspect"] = "off"
    with Lagwatch(tmp_path, config) as lw:
        lw.wait_ready()
        pids = {"primary": session_pid(primary, "primary"), replica.name: session_pid(replica, replica.name)}
        lw.wait_cycles(POLLS + 2)
    polls: dict[str, list[str]] = {}
    for node, server in (("primary", primary), (replica.name, replica)):
        said = statements(server, offsets[server.name], pids[node])
        polls[node] = [s for s in said if "lagwatch_cycle_" in s.split(":", 2)[1]]
        once = [s for s in said if s not in polls[node]]
        # Per connection: the probe, the replica's session setting, the walsenders' names.
        assert len(once) <= 2, once
        assert len(polls[node]) >= POLLS, (node, len(polls[node]))
    for node, markers, never in (
            ("primary", ("pg_subscription", "pg_stat_activity", "pg_prepared_xacts"), ("set_config",)),
            (replica.name, ("sync_replication_slots", "pg_stat_io"), ("set_config",))):
        for n, sql in enumerate(polls[node]):
            for marker in markers:
                assert (marker in sql) == (n % 10 == 0), (node, n, marker)
            for marker in never:
                assert marker not in sql, (node, n, marker)
    # Where the slot sync view is read, the synced copies are not while sync is off: the
    # server plans their subquery and never runs it.
    version = int(replica.execute("SHOW server_version_num")[0][0])
    plan = "\n".join(r[0] for r in replica.execute(f"EXPLAIN (ANALYZE, COSTS OFF) {slotsync.VIEW.sql_for(version)}"))
    scans = [line for line in plan.splitlines() if "pg_get_replication_slots" in line]
    assert scans and all("never executed" in line for line in scans), plan
