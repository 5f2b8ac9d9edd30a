"""/metrics as Prometheus's own tools read it, from a real lagwatch on a real cluster:

- a bare lagwatch (one cluster: no pool, no synchronous standby, no Patroni, no
  clusters_dir) declares every family the shipped dashboard and alert rules query, so each
  can be checked against a live scrape;
- `promtool check metrics` finds nothing to say about a scrape of a cluster with pool
  control, synchronous replication and slots.

What is tested does not depend on the PostgreSQL version: one runs these.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from chaoscluster import ChaosCluster
from harness import ROOT, Lagwatch, cluster_config
from lagwatch.demo.ports import free_port

pytestmark = pytest.mark.one_pg_version

NAME = re.compile(r"(?<![\w:])(lagwatch_[a-z0-9_]+)")
SUFFIXES = ("_bucket", "_count", "_sum")


@pytest.fixture(scope="module")
def cluster(pg_cluster: ChaosCluster) -> ChaosCluster:
    """The run's shared cluster (conftest.py): nothing here needs one of its own."""
    return pg_cluster


def scrape(lw: Lagwatch) -> str:
    with urllib.request.urlopen(lw.url("/metrics"), timeout=10) as response:
        return str(response.read().decode())


def queried_names() -> dict[str, set[str]]:
    """Every lagwatch metric name the shipped dashboard and rule files query, by file."""
    out: dict[str, set[str]] = {}
    dashboard = json.loads((ROOT / "dashboards" / "lagwatch.json").read_text())

    def exprs(node: object) -> Iterator[str]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("expr", "query") and isinstance(value, str):
                    yield value
                else:
                    yield from exprs(value)
        elif isinstance(node, list):
            for item in node:
                yield from exprs(item)

    out["dashboards/lagwatch.json"] = {n for e in exprs(dashboard) for n in NAME.findall(e)}
    for rules in ("lagwatch.rules.yml", "lagwatch.fleet.rules.yml"):
        groups = yaml.safe_load((ROOT / "alerts" / rules).read_text())["groups"]
        out[f"alerts/{rules}"] = {n for g in groups for r in g["rules"] for n in NAME.findall(r["expr"])}
    return out


def test_a_bare_lagwatch_declares_every_family_the_dashboard_and_rules_query(cluster: ChaosCluster,
                                                                             tmp_path: Path) -> None:
    with Lagwatch.for_cluster(tmp_path, cluster) as lw:
        lw.wait_ready()
        text = scrape(lw)
    declared = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    for where, names in queried_names().items():
        assert names, where
        missing = sorted(n for n in names if n not in declared
                         and not any(n.endswith(s) and n.removesuffix(s) in declared for s in SUFFIXES))
        assert missing == [], f"{where} queries families a bare lagwatch does not declare: {missing}"


def test_promtool_check_metrics_finds_nothing(cluster: ChaosCluster, tmp_path: Path) -> None:
    cluster.primary.execute("ALTER SYSTEM SET synchronous_standby_names = 'ANY 1 (replica1, replica2)'")
    cluster.primary.execute("SELECT pg_reload_conf()")
    try:
        config = cluster_config(cluster, free_port(["127.0.0.1"]), state_dir=str(tmp_path / "state"))
        config["clusters"][0]["pooler"] = {"kind": "command", "template": "{members}\n",
                                           "output_file": str(tmp_path / "pool.txt"), "reload_command": ["true"]}
        with Lagwatch(tmp_path, config) as lw:
            lw.wait_ready()
            lw.wait_for("the pool applied, sync assessed, slots read", lambda: (
                lw.value("lagwatch_pool_pooler_member", replica="replica1") == 1
                and lw.value("lagwatch_sync_standbys_required") == 1
                and lw.value("lagwatch_slot_active", slot="replica1") == 1), 20)
            text = scrape(lw)
    finally:
        cluster.primary.execute("ALTER SYSTEM RESET synchronous_standby_names")
        cluster.primary.execute("SELECT pg_reload_conf()")
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                            timeout=60)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")
