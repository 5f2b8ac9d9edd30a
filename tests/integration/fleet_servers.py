"""A fleet on three real servers (a primary and two streaming replicas): many clusters that
all point at them, as one lagwatch of a platform team watches hundreds. The servers and
the helpers test_fleet.py (a hung node's cost, a timing test) and test_fleet_membership.py
(sessions, cluster files, shards: no timing judged) share."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from chaoscluster import ChaosCluster
from harness import LagwatchHttp
from lagwatch.demo.ports import free_port

NODES = ("primary", "replica1", "replica2")


class FleetServers(ChaosCluster):
    """Room for four daemons' sessions to 50 clusters each, and the tests' own."""

    def primary_settings(self) -> dict[str, str]:
        return {**super().primary_settings(), "max_connections": "300"}


def cluster_entry(servers: ChaosCluster, name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "primary": {"dsn": servers.primary.dsn()},
            "replicas": [{"name": r.name, "dsn": r.dsn()} for r in servers.replicas], **extra}


def fleet_config(workdir: Path, clusters: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"interval": "1s", "window": "1m", "listen": f"127.0.0.1:{free_port(['127.0.0.1'])}",
            "state_dir": str(workdir / "state"), **extra, "clusters": clusters}


def sessions(servers: ChaosCluster) -> dict[str, Counter[str]]:
    """lagwatch's polling sessions on each server, by application_name."""
    return {s.name: Counter(str(row[0]) for row in s.execute(
        "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE 'lagwatch/%'"))
        for s in servers.servers}


def metric(lw: LagwatchHttp, name: str, **labels: str) -> float | None:
    """A sample by its exact labels (no cluster label added)."""
    return lw.samples().get((name, frozenset(labels.items())))


def up_nodes(lw: LagwatchHttp) -> set[tuple[str, str]]:
    return {(dict(labels)["cluster"], dict(labels)["node"]) for (name, labels), value in lw.samples().items()
            if name == "lagwatch_up" and value == 1}


def per_node(lw: LagwatchHttp, metric: str) -> dict[tuple[str, str], float]:
    return {(dict(labels)["cluster"], dict(labels)["node"]): value for (name, labels), value in lw.samples().items()
            if name == metric}


def write_cluster_file(path: Path, servers: ChaosCluster, replicas: list[str], **extra: Any) -> None:
    entry = cluster_entry(servers, path.stem, **extra)
    del entry["name"]  # the file's name is the cluster's
    entry["replicas"] = [r for r in entry["replicas"] if r["name"] in replicas]
    temporary = path.with_suffix(".tmp")
    temporary.write_text(yaml.safe_dump(entry))
    temporary.rename(path)  # as config management writes files: whole, or not at all


def polled(lw: LagwatchHttp) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for cluster, node in per_node(lw, "lagwatch_up"):
        out.setdefault(cluster, set()).add(node)
    return out
