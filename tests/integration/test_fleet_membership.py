"""A fleet on three real servers (a primary and two streaming replicas), as one lagwatch of a
platform team watches hundreds: who polls what, with how many sessions. No timing is
judged here (a hung node's cost is: test_fleet.py).

- 50 clusters: exactly one session per node per daemon (pg_stat_activity, by the
  application_name each node's session carries), also after every server is restarted
  once, with each node's connection attempts counted (no reconnect storm);
- clusters_dir: files added, changed, broken and removed while the daemon runs;
- two shards x two instances over 20 clusters: each cluster polled by exactly two
  instances and pool-controlled by one; the fleet recording rules, evaluated by a real
  Prometheus scraping all four, give the fleet views.

What is tested does not depend on the PostgreSQL version: one runs these.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_servers import (
    NODES,
    FleetServers,
    cluster_entry,
    fleet_config,
    metric,
    per_node,
    polled,
    sessions,
    up_nodes,
    write_cluster_file,
)
from harness import ROOT, Lagwatch
from lagwatch.demo.binaries import find_binaries
from lagwatch.shard import shard_of
from prom_stack import Prometheus

pytestmark = pytest.mark.one_pg_version

FLEET_RULES = ROOT / "alerts" / "lagwatch.fleet.rules.yml"


@pytest.fixture(scope="module")
def servers(pg_major: int) -> Iterator[FleetServers]:
    with FleetServers(find_binaries(pg_major), replicas=2) as cluster:
        yield cluster


def test_one_session_per_node_also_after_every_server_restarts(servers: FleetServers, tmp_path: Path) -> None:
    names = [f"c{i:02d}" for i in range(50)]
    lw = Lagwatch(tmp_path, fleet_config(tmp_path, [cluster_entry(servers, n) for n in names]))
    every_node = {(c, n) for c in names for n in NODES}
    expected = {node: Counter({f"lagwatch/{c}/{node}": 1 for c in names}) for node in NODES}
    try:
        lw.wait_ready()
        lw.wait_for("all 150 nodes up", lambda: up_nodes(lw) == every_node, 30)
        assert sessions(servers) == expected
        code, page = lw.get("/status")  # 50 clusters: one line each, and a page per cluster
        assert code == 200 and "<h2>50 clusters</h2>" in page and '<a href="/status?cluster=c07">c07</a>' in page
        code, page = lw.get("/status?cluster=c07")
        assert code == 200 and 'data-cluster="c07"' in page and 'data-replica="replica2"' in page
        assert 'data-cluster="c08"' not in page
        connects = per_node(lw, "lagwatch_connects_total")
        # One connection each (a connect that outlasted its deadline on a busy machine retries).
        assert len(connects) == 150 and max(connects.values()) <= 3, Counter(connects.values())
        for server in servers.servers:
            server.stop("fast")
            server.start()
        servers.wait_streaming(60)
        lw.wait_for("all 150 nodes up again", lambda: up_nodes(lw) == every_node, 60)
        lw.wait_for("one session per node again", lambda: sessions(servers) == expected, 20)

        def attempts() -> dict[tuple[str, str], float]:
            return {node: count - connects[node] for node, count in per_node(lw, "lagwatch_connects_total").items()}

        # The cycle that reconnected publishes its count as it ends: after the sessions show.
        lw.wait_for("every node's reconnect counted", lambda: min(attempts().values()) >= 1, 10)
        spread = Counter(attempts().values())
        print(f"reconnect attempts per node after each server restarted once: {dict(sorted(spread.items()))}")
        # Every node reconnected, and none kept hammering its server while it was down:
        # the first retry is at once, then 1, 2, 4... intervals with jitter.
        assert max(spread) <= 5, spread
        assert sessions(servers) == expected  # still exactly one each
    finally:
        lw.stop()


def test_clusters_dir_files_added_changed_broken_and_removed(servers: FleetServers, tmp_path: Path) -> None:
    folder = tmp_path / "clusters.d"
    folder.mkdir()
    write_cluster_file(folder / "east.yaml", servers, ["replica1"])
    config = fleet_config(tmp_path, [], interval="500ms", clusters_dir=str(folder))
    del config["clusters"]
    with Lagwatch(tmp_path, config) as lw:
        lw.wait_ready()
        lw.wait_for("east polled", lambda: polled(lw) == {"east": {"primary", "replica1"}}, 15)

        def east_session() -> Any:
            return servers.primary.scalar("SELECT pid FROM pg_stat_activity WHERE application_name = "
                                          "'lagwatch/east/primary'")

        east = east_session()
        assert east is not None

        write_cluster_file(folder / "west.yaml", servers, ["replica1", "replica2"])  # added
        lw.wait_for("west polled too", lambda: polled(lw) == {"east": {"primary", "replica1"},
                                                              "west": set(NODES)}, 15)
        assert east_session() == east  # east kept its session
        write_cluster_file(folder / "east.yaml", servers, ["replica1", "replica2"])  # changed
        lw.wait_for("east with replica2", lambda: polled(lw).get("east") == set(NODES), 15)
        (folder / "west.yaml").write_text("primary: {dsn: ''}\nreplicas: [oops\n")  # broken: west keeps running
        lw.wait_for("west reported", lambda: metric(lw, "lagwatch_cluster_config_errors",
                                                    file=str(folder / "west.yaml")) == 1, 15)
        write_cluster_file(folder / "north.yaml", servers, ["replica1"], sla={"max_lag": "0s"})  # new, broken
        lw.wait_for("north reported", lambda: metric(lw, "lagwatch_cluster_config_errors",
                                                     file=str(folder / "north.yaml")) == 1, 15)
        lw.wait_cycles(3)  # north is not polled, west still is
        assert polled(lw) == {"east": set(NODES), "west": set(NODES)}
        assert metric(lw, "lagwatch_cluster_config_errors", file=str(folder / "east.yaml")) == 0
        assert east_session() == east  # through west's arrival and breakage, east's change, north: one session
        (folder / "east.yaml").unlink()  # removed
        lw.wait_for("east gone", lambda: set(polled(lw)) == {"west"}, 15)
        lw.wait_for("east's session closed", lambda: "lagwatch/east/primary" not in sessions(servers)["primary"], 10)
        log = lw.log_text()
        assert f"clusters_dir: {folder / 'west.yaml'}: " in log and "its last good version stays in force" in log
        assert f"clusters_dir: {folder / 'north.yaml'}: sla: max_lag must be greater than 0" in log
        assert "not watched until it is fixed" in log
        assert "Traceback" not in log


def test_two_shards_of_two_instances_split_the_fleet_and_one_leads_each_cluster(
        servers: FleetServers, tmp_path: Path) -> None:
    names = [f"s{i:02d}" for i in range(20)]
    pools = tmp_path / "pools"
    pools.mkdir()

    def entry(name: str) -> dict[str, Any]:
        # A command pooler per cluster: the leader writes its file (both instances of a shard would).
        return cluster_entry(servers, name, pooler={"kind": "command", "template": "{hosts}\n",
                                                    "output_file": str(pools / f"{name}.txt"),
                                                    "reload_command": ["true"]})

    instances: list[tuple[int, Lagwatch]] = []
    with contextlib.ExitStack() as stack:
        for index in (0, 0, 1, 1):
            workdir = tmp_path / f"lw{len(instances)}"
            workdir.mkdir()
            lw = Lagwatch(workdir, fleet_config(workdir, [entry(n) for n in names],
                                               shard={"index": index, "count": 2}))
            stack.callback(lw.stop)
            instances.append((index, lw))
        for _, lw in instances:
            lw.wait_ready()

        def watchers_and_leaders() -> tuple[dict[str, int], dict[str, float]]:
            watching: Counter[str] = Counter()
            leading: dict[str, float] = {}
            for _, lw in instances:
                samples = lw.samples()
                for cluster in {dict(k)["cluster"] for (n, k), _ in samples.items() if n == "lagwatch_up"}:
                    watching[cluster] += 1
                for (n, k), v in samples.items():
                    if n == "lagwatch_leader":
                        leading[dict(k)["cluster"]] = leading.get(dict(k)["cluster"], 0.0) + v
            return dict(watching), leading

        def settled() -> bool:
            watching, leading = watchers_and_leaders()
            return watching == dict.fromkeys(names, 2) and leading == dict.fromkeys(names, 1.0)

        for _, lw in instances[:1]:
            lw.wait_for("every cluster watched by two instances and led by one", settled, 30)
        for index, lw in instances:  # each instance watches exactly its shard's clusters
            assert set(polled(lw)) == {n for n in names if shard_of(n, 2) == index}
            assert metric(lw, "lagwatch_shard", index=str(index), count="2") == 1
        assert all((pools / f"{n}.txt").exists() for n in names)  # and each one's pool was written

        # Three shards instead of two: only the clusters the new shard scores highest move.
        moved = [n for n in names if shard_of(n, 3) != shard_of(n, 2)]
        print(f"count 2 -> 3 moves {len(moved)} of {len(names)} clusters, all to the new shard")
        assert all(shard_of(n, 3) == 2 for n in moved) and len(moved) <= len(names) // 3 + 3

        # One Prometheus job over every instance of every shard, and the fleet rules.
        prometheus = Prometheus([f"127.0.0.1:{lw.port}" for _, lw in instances], [FLEET_RULES])
        stack.callback(prometheus.stop)
        prometheus.start()

        def fleet(expr: str) -> dict[str, float]:
            result = prometheus.query(expr)["data"]["result"]
            return {r["metric"].get("cluster", ""): float(r["value"][1]) for r in result}

        # Prometheus appends each recording rule's result on its own, so two queries can see two
        # evaluations (a test that waited on one view and then read the next failed once, the
        # second view still from an evaluation before every instance was scraped): every view is
        # read in one pass, and the pass that shows them all as expected is the one asserted.
        expected = {
            "cluster:lagwatch_watchers:count": dict.fromkeys(names, 2.0),
            "cluster:lagwatch_leaders:sum": dict.fromkeys(names, 1.0),
            "cluster:lagwatch_replicas_out_of_pool:count": dict.fromkeys(names, 0.0),
            "lagwatch:clusters:count": {"": 20.0},
            "lagwatch:replicas_out_of_pool:sum": {"": 0.0},
            "lagwatch:clusters_at_sync_risk:count": {"": 0.0},
        }
        seen: dict[str, dict[str, float]] = {}

        def views_as_expected() -> bool:
            seen.clear()
            seen.update({expr: fleet(expr) for expr in [*expected, "cluster:lagwatch_replica_lag_p95_seconds:max"]})
            return all(seen[expr] == want for expr, want in expected.items()) and len(
                seen["cluster:lagwatch_replica_lag_p95_seconds:max"]) == 20

        try:
            instances[0][1].wait_for("the fleet views recorded from all four instances", views_as_expected, 60)
        except AssertionError:
            print("last fleet views seen:", seen)
            raise
        assert all(v < 1.0 for v in seen["cluster:lagwatch_replica_lag_p95_seconds:max"].values())
