"""A hung node (its backend stopped with SIGSTOP) in one cluster of 20 on three real servers:
the other 19 are published every cycle, on time. (The fleet's sessions, cluster files and
shards: test_fleet_membership.py, which judges no timing.)

What is tested does not depend on the PostgreSQL version: one runs these.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_servers import FleetServers, cluster_entry, fleet_config, up_nodes
from harness import Lagwatch
from lagwatch.demo.binaries import find_binaries

pytestmark = pytest.mark.one_pg_version


@pytest.fixture(scope="module")
def servers(pg_major: int) -> Iterator[FleetServers]:
    with FleetServers(find_binaries(pg_major), replicas=2) as cluster:
        yield cluster


def test_a_hung_node_costs_the_other_clusters_nothing(servers: FleetServers, tmp_path: Path) -> None:
    names = [f"h{i:02d}" for i in range(20)]
    lw = Lagwatch(tmp_path, fleet_config(tmp_path, [cluster_entry(servers, n) for n in names]))
    hung = ("h07", "replica1")
    replica1 = servers.replicas[0]
    try:
        lw.wait_ready()
        lw.wait_for("all 60 nodes up", lambda: len(up_nodes(lw)) == 60, 30)
        (pid,) = [int(row[0]) for row in replica1.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (f"lagwatch/{hung[0]}/{hung[1]}",))]
        overruns = lw.daemon_value("lagwatch_cycle_overruns_total")
        os.kill(pid, signal.SIGSTOP)  # a backend of our own test server: the host is "hung" for this node
        try:
            lw.wait_for("the hung node read as down", lambda: hung not in up_nodes(lw), 10)
            published: list[tuple[float, float, set[tuple[str, str]]]] = []
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline:
                samples = lw.samples()
                cycles = samples[("lagwatch_cycles_total", frozenset())]
                if not published or cycles != published[-1][0]:
                    published.append((cycles, samples[("lagwatch_last_poll_timestamp_seconds", frozenset())],
                                      {(dict(k)["cluster"], dict(k)["node"]) for (n, k), v in samples.items()
                                       if n == "lagwatch_up" and v == 0}))
                time.sleep(0.02)
        finally:
            os.kill(pid, signal.SIGCONT)
        # A cycle every second (numbered, about a second apart), and in each one seen only
        # the hung node was down: the other 19 clusters' 59 nodes answered on time. A cycle
        # the hung node held to its deadline ends close to the next one's start: a scrape
        # can fall after both and pass a number over; the seconds per cycle between the
        # ones seen still show whether any cycle came late.
        numbers = [int(c) for c, _, _ in published]
        assert numbers[-1] - numbers[0] >= 4 and len(numbers) >= 3, numbers
        assert len(numbers) * 3 >= 2 * (numbers[-1] - numbers[0] + 1), f"too few cycles seen to judge: {numbers}"
        per_cycle = [(b - a) / (m - n) for (n, a, _), (m, b, _) in itertools.pairwise(published)]
        assert max(per_cycle) <= 1.5, (numbers, per_cycle)
        # The hung node read as down while its statement waited, until its socket was closed
        # and it reconnected (to a new backend: only the stopped one hangs); nothing else.
        downs = [down for _, _, down in published]
        assert {hung} in downs and all(down <= {hung} for down in downs), downs
        assert lw.daemon_value("lagwatch_cycle_overruns_total") == overruns
        lw.wait_for("the hung node back", lambda: hung in up_nodes(lw), 20)
    finally:
        lw.stop()
