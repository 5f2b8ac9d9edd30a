"""/metrics as Prometheus's own tools read it, from a real lagwatch on a real cluster:

- a bare lagwatch (one cluster: no pool, no synchronous standby, no Patroni, no
  clusters_dir) declares every family the shipped dashboard and alert rules query, so each
  can be checked against a live scrape;
- `promtool check metrics` finds nothing to say about a scrape of a cluster with pool
  control, synchronous replication and slots;
- a real Prometheus's scrapes are answered in gzip (it always asks), in OpenMetrics (what
  2.42 prefers), and read as the plain text is; a client that refuses gzip gets the text as is;
- a Prometheus with native histograms on is answered in protobuf and stores the staleness
  histogram as a native one, whose p95 agrees with lagwatch's own window p95 within one
  bucket's width for a replica held at a known apply delay; a Prometheus without the flag
  gets the classic buckets as before; the shipped fleet rule reads either;
- the OpenMetrics answer passes prometheus_client's OpenMetrics parser.

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
from typing import Any

import pytest
import yaml
from chaoscluster import ChaosCluster
from harness import ROOT, Lagwatch, Writer, cluster_config
from lagwatch.demo.ports import free_port
from prom_stack import Prometheus

pytestmark = pytest.mark.one_pg_version
# What Debian's Prometheus 2.42 asks for, as its scrape/scrape.go has it, without and with
# --enable-feature=native-histograms (tests/unit/test_negotiation.py has Prometheus 3's).
PROMETHEUS_2_42 = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                   "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
PROMETHEUS_2_42_NATIVE = ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,"
                          "application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;"
                          "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")

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
        self.requests = bytearray()
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
            for src, dst, keep in ((client, server, self.requests), (server, client, self.answers)):
                t = threading.Thread(target=self._pump, args=(src, dst, keep), daemon=True)
                t.start()
                self.threads.append(t)

    def _pump(self, src: socket.socket, dst: socket.socket, keep: bytearray) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if len(keep) < 4 << 20:
                    keep += data
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
        # Debian's Prometheus 2.42 prefers OpenMetrics, and reads it (the query above).
        assert f"accept: {PROMETHEUS_2_42}\r\n".lower() in bytes(relay.requests[:4096]).decode("latin-1").lower()
        assert "content-type: application/openmetrics-text; version=1.0.0; charset=utf-8" in head, head
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


def test_a_prometheus_with_native_histograms_stores_them_and_agrees_with_lagwatchs_p95(
        cluster: ChaosCluster, tmp_path: Path) -> None:
    """replica1 held 1 s behind (recovery_min_apply_delay) under a commit every 5 ms: its
    staleness samples sit in [1 s, ~1.01 s]. Both Prometheus instances scrape the same
    lagwatch every second; the one with native histograms asks for protobuf."""
    delay, window = 1.0, 10.0
    replica = cluster.replicas[0]
    rules = [ROOT / "alerts" / "lagwatch.fleet.rules.yml"]
    config = cluster_config(cluster, free_port(["127.0.0.1"]), interval="100ms", window=f"{window:g}s")
    with contextlib.ExitStack() as stack, Writer(cluster, every=0.005, max_seconds=120):
        replica.set_apply_delay(delay)
        stack.callback(replica.set_apply_delay, 0)
        lw = stack.enter_context(Lagwatch(tmp_path, config))
        lw.wait_ready()
        relay = Relay(lw.port)
        stack.callback(relay.close)
        native = Prometheus([f"127.0.0.1:{relay.port}"], rules, features=("native-histograms",))
        classic = Prometheus([f"127.0.0.1:{lw.port}"], rules)
        for prometheus in (native, classic):
            prometheus.start()
            stack.callback(prometheus.stop)
        lw.wait_for("replica1 held at the delay", lambda: (lw.value("lagwatch_replica_lag_seconds", replica="replica1")
                                                           or 0) >= delay, 30)
        lw.wait_cycles(int(window / 0.1) + 20)  # the window holds nothing but held samples
        requests = bytes(relay.requests[:8192]).decode("latin-1").lower()
        assert f"accept: {PROMETHEUS_2_42_NATIVE}\r\n".lower() in requests
        head = bytes(relay.answers[:4096]).split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
        assert "content-type: application/vnd.google.protobuf; proto=io.prometheus.client.metricfamily; " \
               "encoding=delimited" in head, head

        # One evaluation instant for both numbers: each reads the last scrape at or before it,
        # so lagwatch's p95 is the one that scrape stored, and the histogram's increase over
        # the window before that scrape holds about the same samples (one scrape's worth of
        # difference at the window's start).
        name = "lagwatch_replica_lag_sampled_seconds"
        selector = name + '{replica="replica1"}'
        stored = native.query(selector)["data"]["result"]
        assert len(stored) == 1 and "histogram" in stored[0], stored  # a native histogram, stored as one
        at = float(stored[0]["histogram"][0])
        ours = one(native.query('lagwatch_replica_lag_window_seconds{replica="replica1",quantile="0.95"}', at))
        theirs = one(native.query(f"histogram_quantile(0.95, increase({selector}[{window + 1:g}s]))", at))
        # The width of the bucket that holds lagwatch's p95, as Prometheus stored the buckets.
        buckets = [(float(lower), float(upper)) for _, lower, upper, _ in
                   native.query(selector, at)["data"]["result"][0]["histogram"][1]["buckets"]]
        lower, upper = next((lo, up) for lo, up in buckets if lo < ours <= up)
        assert abs(ours - delay) < 0.05, ours  # held: the delay, give or take the dating's milliseconds
        print(f"p95: lagwatch's window {ours:.6f} s, Prometheus's native histogram {theirs:.6f} s, "
              f"bucket ({lower:.6f}, {upper:.6f}]")
        assert abs(theirs - ours) <= upper - lower, (theirs, ours, upper - lower)
        assert no_series(native, f"{name}_bucket")  # 2.42 keeps the native series only

        # Without the flag: the classic buckets, as before, and no native series.
        assert classic.query("count(lagwatch_replica_lag_sampled_seconds_bucket{replica=\"replica1\"})")[
            "data"]["result"][0]["value"][1] == "26"
        assert "histogram" not in (classic.query(selector)["data"]["result"] or [{}])[0]
        # The fleet rule's p95 reads the native histogram on one, the classic buckets on the other.
        rule = 'cluster:lagwatch_replica_lag_sampled_seconds:p95_rate5m{cluster="main"}'
        lw.wait_for("both evaluated the fleet rule", lambda: all(
            p.query(rule)["data"]["result"] for p in (native, classic)), 20)
        assert abs(one(native.query(rule)) - delay) < 0.05
        # interpolated inside a classic bucket around 1 s: (0.75, 1] or (1, 2.5]
        assert 0.75 <= one(classic.query(rule)) <= 2.5


def one(answer: dict[str, Any]) -> float:
    result = answer["data"]["result"]
    assert len(result) == 1, answer
    return float(result[0]["value"][1])


def no_series(prometheus: Prometheus, name: str) -> bool:
    return prometheus.query(f"count({name})")["data"]["result"] == []


def test_the_openmetrics_answer_passes_prometheus_clients_parser(cluster: ChaosCluster, tmp_path: Path) -> None:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    with Lagwatch.for_cluster(tmp_path, cluster) as lw:
        lw.wait_ready()
        lw.wait_cycles(3)
        asked = urllib.request.Request(lw.url("/metrics"), headers={"Accept": PROMETHEUS_2_42})
        with urllib.request.urlopen(asked, timeout=10) as response:
            assert response.headers["Content-Type"] == "application/openmetrics-text; version=1.0.0; charset=utf-8"
            openmetrics = response.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(openmetrics)}
    assert families["lagwatch_cycles"].type == "counter" and families["lagwatch_replica_lag_seconds"].unit == "seconds"
    assert families["lagwatch_replica_lag_sampled_seconds"].type == "histogram"
    assert openmetrics.endswith("# EOF\n")
