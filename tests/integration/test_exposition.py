"""/metrics as Prometheus's own tools read it, from a real lagwatch on a real cluster:

- a bare lagwatch (one cluster: no pool, no synchronous standby, no Patroni, no
  clusters_dir) declares every family the shipped dashboard and alert rules query, so each
  can be checked against a live scrape;
- `promtool check metrics` finds nothing to say about a scrape of a cluster with pool
  control, synchronous replication and slots;
- a real Prometheus's scrapes are answered in gzip (it always asks), and read as the plain
  text is; a client that refuses gzip gets the text as is.

What is tested does not depend on the PostgreSQL version: one runs these.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import re
import socket
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from chaoscluster import ChaosCluster
from harness import ROOT, Lagwatch, cluster_config
from lagwatch.demo.ports import free_port
from prom_stack import Prometheus

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


class Relay:
    """A TCP relay between a scraper and lagwatch that keeps what lagwatch answered: to see
    the bytes a real Prometheus is sent. Bounded: one thread a connection, stops with the test."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.answers = bytearray()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.threads: list[threading.Thread] = []
        self._serve = threading.Thread(target=self._accept, daemon=True)
        self._serve.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(("127.0.0.1", self.upstream))
            for src, dst, keep in ((client, server, False), (server, client, True)):
                t = threading.Thread(target=self._pump, args=(src, dst, keep), daemon=True)
                t.start()
                self.threads.append(t)

    def _pump(self, src: socket.socket, dst: socket.socket, keep: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if keep and len(self.answers) < 4 << 20:
                    self.answers += data
                dst.sendall(data)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()


def test_a_real_prometheus_is_answered_in_gzip_and_reads_it(cluster: ChaosCluster, tmp_path: Path) -> None:
    with Lagwatch.for_cluster(tmp_path, cluster) as lw, contextlib.ExitStack() as stack:
        lw.wait_ready()
        relay = Relay(lw.port)
        stack.callback(relay.close)
        prometheus = Prometheus([f"127.0.0.1:{relay.port}"], [])
        prometheus.start()
        stack.callback(prometheus.stop)
        lw.wait_for("Prometheus reading lagwatch's nodes up", lambda: len(
            prometheus.query("lagwatch_up == 1").get("data", {}).get("result", [])) == 3, 20)
        head = bytes(relay.answers[:4096]).split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
        assert "content-encoding: gzip" in head and "vary: accept, accept-encoding" in head, head
        # As a client sees it: the gzip, decompressed, is the text; gzip;q=0 gets the text.
        plain = urllib.request.Request(lw.url("/metrics"), headers={"Accept-Encoding": "gzip;q=0"})
        with urllib.request.urlopen(plain, timeout=10) as response:
            assert response.headers.get("Content-Encoding") is None
            text = response.read()
        zipped = urllib.request.Request(lw.url("/metrics"), headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(zipped, timeout=10) as response:
            assert response.headers["Content-Encoding"] == "gzip"
            body = response.read()
        assert len(body) < len(text) / 3
        assert gzip.decompress(body).startswith(b"# HELP") and b"lagwatch_up{" in gzip.decompress(body)
