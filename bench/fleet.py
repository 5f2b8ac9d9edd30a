"""Benchmark: one lagwatch watching a fleet of N clusters of 3 nodes at `interval: 1s`.

Starts a real primary with two streaming replicas (max_connections raised for the fleet),
writes a few commits a second on it, and runs `lagwatch run` on a config of N clusters
that all point at those three servers (so N x 3 nodes, N x 3 connections). For each N it
lets lagwatch settle, then measures for `--seconds` and prints one row:

- lagwatch's CPU (% of one core) and CPU ms per node-cycle (CPU / (cycles x nodes));
- cycle median / p99 over the measured cycles, estimated from the lagwatch_cycle_seconds
  histogram's counts at the start and the end (interpolated within a bucket as PromQL's
  histogram_quantile does: with a minute of cycles p99 is near the slowest, placed inside
  its bucket), and how many of them took longer than half the interval (exact: 0.5 s is a
  bucket bound);
- RSS at the end (and, with --soak, every minute of a long run, to show it stays flat);
- /metrics as Prometheus gets it: scraped every 15 s, each time the first scrape after a
  new cycle (the median and the slowest of them), and, after the measured time, what a
  scrape costs that comes off that pace (rendered when asked: the median of three);
- series on /metrics;
- the servers' CPU spent in lagwatch's backends (% of one core, all three servers);
- lagwatch's connections per server (pg_stat_activity by application_name).

It prints; it asserts nothing (targets, issue 6/6: 300 x 3 at 1 s on <= 25 % of one core,
<= 0.28 ms CPU per node-cycle, cycle p99 < 500 ms, RSS < 150 MB, scrape < 100 ms).

    python3 bench/fleet.py [--clusters 1,10,100,300] [--seconds 60] [--passes 1] [--soak 0]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "daemon"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from harness import Lagwatch  # noqa: E402
from lagwatch.localcluster import LocalCluster, LocalServer  # noqa: E402
from lagwatch.pgbinaries import find_binaries  # noqa: E402
from lagwatch.ports import free_port  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
SCRAPE_EVERY = 15.0  # as a Prometheus scraping every 15 s (its CPU counts in the figures)


class FleetCluster(LocalCluster):
    """The three servers every cluster of the fleet points at: room for 300 x 3 connections."""

    def primary_settings(self) -> dict[str, str]:
        return {**super().primary_settings(), "max_connections": "400", "shared_buffers": "64MB"}


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def lagwatch_backends(server: LocalServer) -> list[int]:
    rows = server.execute("SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'lagwatch/%'")
    return [int(r[0]) for r in rows]


def fleet_config(cluster: LocalCluster, clusters: int, port: int, workdir: Path) -> dict[str, Any]:
    return {
        "interval": "1s", "window": "5m", "listen": f"127.0.0.1:{port}", "state_dir": str(workdir / "state"),
        "clusters": [{"name": f"c{i:03d}", "primary": {"dsn": cluster.primary.dsn()},
                      "replicas": [{"name": r.name, "dsn": r.dsn()} for r in cluster.replicas]}
                     for i in range(clusters)],
    }


def scrape(lw: Lagwatch) -> tuple[float, str]:
    started = time.perf_counter()
    with urllib.request.urlopen(lw.url("/metrics"), timeout=30) as response:
        body = response.read().decode()
    return time.perf_counter() - started, body


def sample_values(text: str, name: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[s.labels.get("quantile", "")] = s.value
    return out


def cycle_buckets(text: str) -> list[tuple[float, float]]:
    """lagwatch_cycle_seconds' cumulative buckets: (upper bound, count), +Inf last."""
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "lagwatch_cycle_seconds_bucket":
                out.append((float(s.labels["le"]), s.value))
    return sorted(out)


def bucket_quantile(q: float, before: list[tuple[float, float]], after: list[tuple[float, float]]) -> float:
    """The q-quantile of the cycles counted between two readings of the histogram, by
    linear interpolation within its bucket (as PromQL's histogram_quantile)."""
    counts = [(le, a - b) for (le, a), (_, b) in zip(after, before, strict=True)]
    total = counts[-1][1]
    if total <= 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for le, cumulative in counts:
        if cumulative >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * (rank - below) / max(cumulative - below, 1e-9)
        lower, below = le, cumulative
    return lower


def cycles_over(seconds: float, before: list[tuple[float, float]], after: list[tuple[float, float]]) -> float:
    """Cycles counted between the two readings that took longer than ``seconds`` (a bucket bound)."""
    within = {le: a - b for (le, a), (_, b) in zip(after, before, strict=True)}
    return within[float("inf")] - within[seconds]


@dataclass
class Row:
    clusters: int
    cpu_percent: float
    cpu_ms_per_node_cycle: float
    cycle_median_ms: float
    cycle_p99_ms: float
    cycles_over_half: float
    rss_mb: float
    scrape_ms: float
    scrape_max_ms: float
    render_ms: float
    series: int
    backend_cpu_percent: float
    connections: dict[str, int]
    overruns: float


def measure(cluster: LocalCluster, clusters: int, seconds: float, settle: float, soak: float) -> Row:
    with tempfile.TemporaryDirectory(prefix="lagwatch-fleet-") as tmp:
        workdir = Path(tmp)
        # At INFO, as in production: DEBUG adds a line per cluster and cycle.
        lw = Lagwatch(workdir, fleet_config(cluster, clusters, free_port(["127.0.0.1"]), workdir), log_level="info")
        try:
            lw.wait_ready(timeout=120)
            # Scraped at Prometheus's pace from the start, so that lagwatch knows the pace
            # by the time measuring begins; the first and the last measured scrapes are the
            # readings the figures are taken between.
            paced = Pace(time.monotonic())
            scrape(lw)
            # Three scrapes before the measured ones: lagwatch takes the pace from three.
            for _ in range(max(2, round(settle / SCRAPE_EVERY)) - 1):
                paced.wait_next()
                scrape(lw)
            backends = {s.name: lagwatch_backends(s) for s in cluster.servers}
            connections = {name: len(pids) for name, pids in backends.items()}
            paced.wait_next()
            _, before = scrape(lw)
            cycles_before = sample_values(before, "lagwatch_cycles_total")[""]
            overruns_before = sample_values(before, "lagwatch_cycle_overruns_total")[""]
            buckets_before = cycle_buckets(before)
            cpu0, backend0, t0 = cpu_seconds(lw.proc.pid), _backend_cpu(backends), time.monotonic()
            scrapes: list[float] = []
            rss_seen: list[float] = []
            next_rss = t0
            for _ in range(max(1, round(seconds / SCRAPE_EVERY)) - 1):
                while not paced.due():
                    if time.monotonic() >= next_rss:
                        rss_seen.append(rss_mb(lw.proc.pid))
                        next_rss += 60
                    time.sleep(0.01)
                paced.next()
                scrapes.append(scrape(lw)[0])  # each the first after a new cycle, as Prometheus's
            paced.wait_next()
            took, after = scrape(lw)
            scrapes.append(took)
            wall = time.monotonic() - t0
            cpu, backend = cpu_seconds(lw.proc.pid) - cpu0, _backend_cpu(backends) - backend0
            cycles = sample_values(after, "lagwatch_cycles_total")[""] - cycles_before
            buckets_after = cycle_buckets(after)
            series = sum(1 for line in after.splitlines() if line and not line.startswith("#"))
            rss = rss_mb(lw.proc.pid)
            renders = []
            for _ in range(3):  # off the pace, 5 s apart (no pace lagwatch could take from them): rendered when asked
                time.sleep(5)
                renders.append(_first_scrape_after_a_cycle(lw))
            if soak:
                print(f"  RSS every minute: {', '.join(f'{v:.0f}' for v in rss_seen)} MB", flush=True)
            return Row(clusters, 100 * cpu / wall, 1000 * cpu / max(1, cycles * clusters * 3),
                       1000 * bucket_quantile(0.5, buckets_before, buckets_after),
                       1000 * bucket_quantile(0.99, buckets_before, buckets_after),
                       cycles_over(0.5, buckets_before, buckets_after),  # half the 1 s interval
                       rss, 1000 * statistics.median(scrapes) if scrapes else float("nan"),
                       1000 * max(scrapes, default=float("nan")), 1000 * statistics.median(renders), series,
                       100 * backend / wall, connections,
                       sample_values(after, "lagwatch_cycle_overruns_total")[""] - overruns_before)
        finally:
            lw.stop()


class Pace:
    """Scrape times every SCRAPE_EVERY seconds from ``start``, as Prometheus keeps them."""

    def __init__(self, start: float) -> None:
        self.at = start

    def due(self) -> bool:
        return time.monotonic() >= self.at + SCRAPE_EVERY

    def next(self) -> None:
        self.at += SCRAPE_EVERY

    def wait_next(self) -> None:
        self.next()
        time.sleep(max(0.0, self.at - time.monotonic()))


def _backend_cpu(backends: dict[str, list[int]]) -> float:
    return sum(cpu_seconds(pid) for pids in backends.values() for pid in pids)


def _first_scrape_after_a_cycle(lw: Lagwatch) -> float:
    """A scrape off Prometheus's pace, the first after a cycle was published (so nothing
    rendered it ahead): wait for the next publication (its timestamp on /metrics changes),
    then time the scrape that follows."""
    _, text = scrape(lw)
    last = sample_values(text, "lagwatch_last_poll_timestamp_seconds")[""]
    time.sleep(max(0.0, last + 1.0 + 0.02 - time.time()))  # just after the next one
    while True:
        took, text = scrape(lw)
        if sample_values(text, "lagwatch_last_poll_timestamp_seconds")[""] != last:
            return took
        time.sleep(0.01)


class Commits:
    """A few commits a second on the primary, for as long as the bench runs."""

    def __init__(self, server: LocalServer, every: float = 0.2) -> None:
        self.server, self.every, self._stop = server, every, threading.Event()
        self.server.execute("CREATE TABLE IF NOT EXISTS fleet_ticks (at timestamptz)")
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.server.execute("INSERT INTO fleet_ticks VALUES (clock_timestamp())")

    def __enter__(self) -> Commits:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clusters", default="1,10,100,300", help="comma-separated fleet sizes")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="measured time per fleet size (a multiple of the 15 s scrape interval)")
    parser.add_argument("--settle", type=float, default=30.0,
                        help="time after start before measuring (scraped every 15 s meanwhile; at least 30)")
    parser.add_argument("--passes", type=int, default=1, help="passes; every other one in reverse order")
    parser.add_argument("--soak", action="store_true", help="print RSS every minute (use with a long --seconds)")
    parser.add_argument("--pg-major", type=int, default=None)
    args = parser.parse_args()
    sizes = [int(n) for n in args.clusters.split(",")]
    binaries = find_binaries(args.pg_major)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()},"
          f" PostgreSQL {binaries.major}; every cluster = the same primary + 2 replicas; interval 1s; "
          f"{args.seconds:.0f}s measured after {args.settle:.0f}s", flush=True)
    rows: list[Row] = []
    with FleetCluster(binaries, replicas=2) as cluster, Commits(cluster.primary):
        for n in range(args.passes):
            for size in sizes if n % 2 == 0 else list(reversed(sizes)):
                row = measure(cluster, size, args.seconds, args.settle, args.soak)
                rows.append(row)
                print(_format(row), flush=True)
    print()
    print("| clusters x nodes | CPU (% of one core) | CPU ms per node-cycle | cycle median / p99 (estimated) | "
          "cycles > 500 ms | "
          "RSS | /metrics at Prometheus's pace (median / max) | off-pace /metrics | series | servers' backend CPU | "
          "sessions per server | overruns |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        conns = " / ".join(str(v) for v in row.connections.values())
        print(f"| {row.clusters} × 3 | {row.cpu_percent:.1f} % | {row.cpu_ms_per_node_cycle:.3f} | "
              f"{row.cycle_median_ms:.1f} / {row.cycle_p99_ms:.1f} ms | {row.cycles_over_half:.0f} | "
              f"{row.rss_mb:.0f} MB | {row.scrape_ms:.1f} / {row.scrape_max_ms:.1f} ms | {row.render_ms:.1f} ms | "
              f"{row.series:,} | {row.backend_cpu_percent:.1f} % | {conns} | {row.overruns:.0f} |")
    return 0


def _format(row: Row) -> str:
    return (f"{row.clusters:4d} x 3: CPU {row.cpu_percent:5.1f} %, {row.cpu_ms_per_node_cycle:.3f} ms/node-cycle, "
            f"cycle {row.cycle_median_ms:.1f}/{row.cycle_p99_ms:.1f} ms ({row.cycles_over_half:.0f} over 500 ms), "
            f"RSS {row.rss_mb:.0f} MB, scrape {row.scrape_ms:.1f}/{row.scrape_max_ms:.1f} ms, "
            f"off-pace {row.render_ms:.1f} ms, {row.series} series, "
            f"backends {row.backend_cpu_percent:.1f} %, "
            f"connections {row.connections}, overruns {row.overruns:.0f}")


if __name__ == "__main__":
    sys.exit(main())
