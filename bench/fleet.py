"""Benchmark: one lagwatch watching a fleet of N clusters of 3 nodes at `interval: 1s`,
without and with pool control.

Starts a real primary with two streaming replicas (max_connections raised for the fleet),
writes a few commits a second on it, and runs `lagwatch run` on a config of N clusters
that all point at those three servers (so N x 3 nodes, N x 3 connections). Each fleet size
is run in two arms, one lagwatch process each, back to back:

- ``plain``: no pool control;
- ``pool``: every cluster under pool control, with a ``command`` pooler (its template
  ``{members}`` written to ``<workdir>/pools/<cluster>.txt``, ``reload_command: [true]``)
  and ``sla: {max_lag: 10s, eject_after: 3, readmit_after: 5, min_replicas: 1}``, so each
  cluster also takes its leader lock on the primary.

The arms alternate (pass 0: plain then pool; pass 1: pool then plain; ...; the sizes in
reverse order every other pass), so the drift of a noisy shared VM falls on both. For each
run it polls /metrics every 0.2 s from the moment the process starts until it has
converged, then lets lagwatch settle, measures for ``--seconds`` and prints one row:

- converged: seconds from starting the process until every node reads ``lagwatch_up`` 1
  (N x 3 samples) and, in the pool arm, every cluster reads ``lagwatch_leader`` 1 (N
  samples), to the answer that showed it (nan if not within 120 s);
- lagwatch's CPU (% of one core) and CPU ms per node-cycle (CPU / (cycles x nodes));
- cycle median / p99 over the measured cycles, estimated from the lagwatch_cycle_seconds
  histogram's counts at the start and the end (interpolated within a bucket as PromQL's
  histogram_quantile does: with a minute of cycles p99 is near the slowest, placed inside
  its bucket), how many of them took longer than half the interval (exact: 0.5 s is a
  bucket bound), and the overruns counted meanwhile;
- RSS at the end (and, with --soak, every minute of a long run, to show it stays flat);
- /metrics as Prometheus gets it (gzip asked for and inflated): scraped every 15 s, each time the first scrape after a
  new cycle (the median and the slowest of them), and, after the measured time, what a
  scrape costs that comes off that pace (rendered when asked: the median of three);
- series on /metrics;
- the servers' CPU spent in the backends of every lagwatch session (application_name
  LIKE 'lagwatch%': the pollers' ``lagwatch/CLUSTER/NODE`` and the leader lock's
  ``lagwatch-leader``; % of one core, all three servers; sessions opened during the
  window count whole), and cpu_ratio: lagwatch's CPU seconds / those backends' CPU
  seconds over the same window;
- lagwatch's sessions per server (the most seen at once, pg_stat_activity by
  application_name, leader-lock sessions among them) beside the nodes each server is
  (N), the primary's marked with *.

After all rows, for each size: what pool control adds to lagwatch's CPU (pool arm CPU /
plain arm CPU - 1, the mean over passes), converged, sessions, overruns and cpu_ratio, each
beside its target.

``--busy N`` adds N CPU-bound neighbours (``python3 -c`` busy loops) to each run, from
just before lagwatch starts (so through convergence, settling and measuring) to the run's
end: each stops by itself after the longest the run can take, and is killed by its PID
when the run ends.

It prints; it asserts nothing. Targets (issue 6/6: 300 x 3 at 1 s on <= 25 % of one core,
<= 0.28 ms CPU per node-cycle, cycle p99 < 500 ms, RSS < 150 MB, scrape < 100 ms; pool
control: it adds <= 20 % CPU, converged within 10 s, sessions = nodes + at most one per
primary server, 0 overruns, cpu_ratio <= 0.8).

``--log-dir DIR`` keeps each run's lagwatch log there, the web server's lines at DEBUG:
for each /metrics render, whether it was made ahead (for which scrape, how far off) or
when asked (and what the last render ahead was of).

``--baseline DIR`` runs each size and arm with another build too (a checkout of it: ``git
worktree add DIR REV``), the two builds alternated (their order swapped every pass and
size), and prints this build's CPU per node-cycle against the baseline's.

    python3 bench/fleet.py [--clusters 1,10,100,300] [--arms plain,pool] [--seconds 60] [--settle 30]
                           [--passes 1] [--busy 0] [--soak] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import math
import os
import platform
import shutil
import statistics
import subprocess
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
from lagwatch.demo.binaries import find_binaries  # noqa: E402
from lagwatch.demo.cluster import LocalCluster  # noqa: E402
from lagwatch.demo.ports import free_port  # noqa: E402
from lagwatch.demo.servers import LocalServer  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
SCRAPE_EVERY = 15.0  # as a Prometheus scraping every 15 s (its CPU counts in the figures)
ARMS = ("plain", "pool")
CONVERGE_EVERY = 0.2  # /metrics polled this often from the process's start until converged
CONVERGE_TIMEOUT = 120.0
SAMPLE_CLEAR = 3.0  # no backends' sampling this close before a paced scrape (seconds)
BACKENDS_EVERY = 5.0  # the backends' CPU read this often while measuring (a session that ends keeps its last reading)
LEADER_APPLICATION_NAME = "lagwatch-leader"

# Targets (printed beside the figures; nothing is asserted).
TARGET_POOL_CPU_ADDED = 0.20
TARGET_CONVERGED_S = 10.0
TARGET_CPU_RATIO = 0.8


class FleetCluster(LocalCluster):
    """The three servers every cluster of the fleet points at: room for 300 x 3 pollers, and
    on the primary for 300 leader-lock sessions more (a daemon that opens one per cluster)."""

    def primary_settings(self) -> dict[str, str]:
        return {**super().primary_settings(), "max_connections": "700", "shared_buffers": "64MB"}


def proc_cpu_seconds(pid: int) -> float | None:
    """User + system CPU of a process, None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS


def cpu_seconds(pid: int) -> float:
    return proc_cpu_seconds(pid) or 0.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Backends:
    """The CPU the servers spend in lagwatch's sessions (application_name LIKE 'lagwatch%':
    pollers and leader-lock sessions) over a window, and how many sessions each server
    holds. A session opened during the window counts whole (it started inside it); one
    that ends keeps its last reading."""

    def __init__(self, servers: list[LocalServer]) -> None:
        self.servers = servers
        self.start: dict[int, float] = {}  # pid: its CPU when the window began (0 if it began after)
        self.last: dict[int, float] = {}
        self.sessions = {s.name: 0 for s in servers}  # the most seen at once
        self.leaders = {s.name: 0 for s in servers}
        self._begun = False

    def refresh(self) -> None:
        """Look the sessions up again (new ones join) and read every known one's CPU."""
        for server in self.servers:
            rows = server.execute("SELECT pid, application_name = %s FROM pg_stat_activity "
                                  "WHERE application_name LIKE 'lagwatch%%'", (LEADER_APPLICATION_NAME,))
            self.sessions[server.name] = max(self.sessions[server.name], len(rows))
            self.leaders[server.name] = max(self.leaders[server.name], sum(1 for r in rows if r[1]))
            for pid, _ in rows:
                if int(pid) not in self.start:
                    cpu = proc_cpu_seconds(int(pid)) if not self._begun else 0.0
                    self.start[int(pid)] = cpu or 0.0
        self._begun = True
        self.sample()

    def sample(self) -> None:
        """Read the CPU of every session seen so far (cheap: /proc only)."""
        for pid in self.start:
            cpu = proc_cpu_seconds(pid)
            if cpu is not None:
                self.last[pid] = cpu

    def seconds(self) -> float:
        return sum(self.last.get(pid, begin) - begin for pid, begin in self.start.items())


class Neighbours:
    """``count`` CPU-bound processes (busy loops) standing for a host's other tenants. Each
    stops by itself ``seconds`` from now; ``stop`` kills any still running by its PID."""

    def __init__(self, count: int, seconds: float) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        end = time.monotonic() + seconds  # CLOCK_MONOTONIC: the same clock in every process
        loop = "import sys, time\nend = float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"
        try:
            for _ in range(count):
                self.procs.append(subprocess.Popen([sys.executable, "-c", loop, repr(end)],
                                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


# --lag-from-wal: each cluster's primary reads commit times from the WAL (auto, the default
# where pg_walinspect is permitted) or not (off): its cost at fleet scale.
LAG_FROM_WAL = "auto"


def fleet_config(cluster: LocalCluster, clusters: int, port: int, workdir: Path, pool: bool) -> dict[str, Any]:
    def one(i: int) -> dict[str, Any]:
        name = f"c{i:03d}"
        entry: dict[str, Any] = {"name": name, "primary": {"dsn": cluster.primary.dsn()},
                                 "replicas": [{"name": r.name, "dsn": r.dsn()} for r in cluster.replicas],
                                 "lag_from_wal": LAG_FROM_WAL}
        if pool:
            entry["sla"] = {"max_lag": "10s", "eject_after": 3, "readmit_after": 5, "min_replicas": 1}
            entry["pooler"] = {"kind": "command", "template": "{members}\n",
                               "output_file": str(workdir / "pools" / f"{name}.txt"), "reload_command": ["true"]}
        return entry

    return {"interval": "1s", "window": "5m", "listen": f"127.0.0.1:{port}", "state_dir": str(workdir / "state"),
            "clusters": [one(i) for i in range(clusters)]}


def scrape(lw: Lagwatch) -> tuple[float, str]:
    """A scrape as Prometheus makes it: gzip asked for (and inflated), the text format (what
    the figures below parse; the same lines as OpenMetrics, in the same time: bench/exposition.py)."""
    started = time.perf_counter()
    asked = urllib.request.Request(lw.url("/metrics"), headers={"Accept": "text/plain;version=0.0.4",
                                                                "Accept-Encoding": "gzip"})
    with urllib.request.urlopen(asked, timeout=30) as response:
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    return time.perf_counter() - started, body.decode()


def _renders(text: str, when: str) -> float:
    """lagwatch_http_metrics_renders_total{when=...} (0 where the build has none)."""
    prefix = f'lagwatch_http_metrics_renders_total{{when="{when}"}} '
    return next((float(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix)), 0.0)


def sample_values(text: str, name: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[s.labels.get("quantile", "")] = s.value
    return out


def count_ones(text: str, name: str) -> int:
    """How many samples of ``name`` (with labels) read 1, by a scan of the lines (a fleet's
    /metrics is too big to parse five times a second)."""
    prefix, count = name + "{", 0
    for line in text.splitlines():
        if line.startswith(prefix):
            try:
                count += float(line.rsplit("}", 1)[1].split()[0]) == 1.0
            except (IndexError, ValueError):
                pass
    return count


def wait_converged(lw: Lagwatch, started: float, nodes: int, leaders: int) -> float:
    """Seconds from ``started`` (the process's start) until /metrics shows every node up and
    ``leaders`` clusters led by this instance (nan if not within CONVERGE_TIMEOUT). Polled
    every CONVERGE_EVERY seconds, also before /readyz: a refused connection is tried again."""
    tick = started
    while time.monotonic() - started < CONVERGE_TIMEOUT:
        if lw.proc.poll() is not None:
            raise RuntimeError(f"lagwatch exited {lw.proc.returncode}:\n{lw.log_text()[-3000:]}")
        try:
            _, text = scrape(lw)
        except OSError:  # not listening yet, or no snapshot yet
            text = ""
        if count_ones(text, "lagwatch_up") == nodes and count_ones(text, "lagwatch_leader") == leaders:
            return time.monotonic() - started
        tick += CONVERGE_EVERY
        time.sleep(max(0.0, tick - time.monotonic()))
    return float("nan")


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
    arm: str
    pass_no: int
    converged_s: float
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
    cpu_ratio: float
    sessions: dict[str, int]  # per server, the most seen at once
    leader_sessions: dict[str, int]  # of them, leader-lock sessions
    primary: str  # the primary server's name
    overruns: float

    def sessions_within_target(self) -> bool:
        """Sessions = nodes (N per server) + at most one per primary server."""
        return all(self.clusters <= n <= self.clusters + (name == self.primary) for name, n in self.sessions.items())


def measure(cluster: LocalCluster, clusters: int, arm: str, pass_no: int, seconds: float, settle: float,
            soak: bool, busy: int, daemon: Path | None = None, log_dir: Path | None = None) -> Row:
    """One run; ``daemon``: another build's ``daemon/`` folder to run instead of this one
    (--baseline: its rows' arm reads ``ARM@base``); ``log_dir``: where its log is kept, the
    web server's lines at DEBUG (why each /metrics was rendered, ahead or when asked)."""
    pool = arm == "pool"
    with tempfile.TemporaryDirectory(prefix="lagwatch-fleet-") as tmp:
        workdir = Path(tmp)
        (workdir / "pools").mkdir()
        config = fleet_config(cluster, clusters, free_port(["127.0.0.1"]), workdir, pool)
        # Neighbours for the whole run; each ends by itself after the longest it can take (60 s
        # more: settling and measuring rounded to the scrape pace, the off-pace scrapes after).
        neighbours = Neighbours(busy, CONVERGE_TIMEOUT + max(settle, 2 * SCRAPE_EVERY) + seconds + 60)
        lw: Lagwatch | None = None
        try:
            # At INFO, as in production: DEBUG adds a line per cluster and cycle.
            lw = Lagwatch(workdir, config, log_level="info", env=_lagwatch_env(daemon, log_dir, workdir))
            # Popen returns once the child has exec'd: this is the process's start (to a few ms).
            converged = wait_converged(lw, time.monotonic(), clusters * 3, clusters if pool else 0)
            lw.wait_ready(timeout=CONVERGE_TIMEOUT)
            row = _measure_running(lw, cluster, clusters, arm, pass_no, converged, seconds, settle, soak)
            return row if daemon is None else dataclasses.replace(row, arm=f"{arm}@base")
        finally:
            if lw is not None:
                lw.stop()
                if log_dir is not None:
                    kept = log_dir / f"{clusters}x3-{arm}-pass{pass_no}{'' if daemon is None else '-base'}.log"
                    shutil.copyfile(lw.log_path, kept)
                    print(f"  log kept: {kept}", flush=True)
            neighbours.stop()


def _lagwatch_env(daemon: Path | None, log_dir: Path | None, workdir: Path) -> dict[str, str]:
    """PYTHONPATH for the build run, and with ``log_dir`` a sitecustomize that puts only the
    web server's logger at DEBUG (its lines are one or two a scrape and cycle; the whole
    DEBUG level adds a line per cluster and cycle, a cost that would change what is
    measured)."""
    path = [str(daemon if daemon is not None else ROOT / "daemon")]
    if log_dir is not None:
        site = workdir / "site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(
            "import logging\nlogging.getLogger('lagwatch.serve.web').setLevel(logging.DEBUG)\n")
        path.insert(0, str(site))
    return {"PYTHONPATH": os.pathsep.join(path)}


def _measure_running(lw: Lagwatch, cluster: LocalCluster, clusters: int, arm: str, pass_no: int, converged: float,
                     seconds: float, settle: float, soak: bool) -> Row:
    # Scraped at Prometheus's pace from the start, so that lagwatch knows the pace by the
    # time measuring begins; the first and the last measured scrapes are the readings the
    # figures are taken between.
    paced = Pace(time.monotonic())
    scrape(lw)
    # Three scrapes before the measured ones: lagwatch takes the pace from three.
    for _ in range(max(2, round(settle / SCRAPE_EVERY)) - 1):
        paced.wait_next()
        scrape(lw)
    paced.wait_next()
    _, before = scrape(lw)
    backends = Backends(cluster.servers)
    backends.refresh()
    cpu0, t0 = cpu_seconds(lw.proc.pid), time.monotonic()
    scrapes: list[float] = []
    rss_seen: list[float] = []
    next_rss, next_backends = t0, t0 + BACKENDS_EVERY
    late: list[float] = []  # how late each measured scrape was sent, against its place on the pace
    for _ in range(max(1, round(seconds / SCRAPE_EVERY)) - 1):
        while not paced.due():
            now = time.monotonic()
            if now >= next_rss:
                rss_seen.append(rss_mb(lw.proc.pid))
                next_rss += 60
            # Not within SAMPLE_CLEAR of a scrape: reading 900 backends' /proc on an
            # overloaded host must not send a paced scrape late (the sample can wait).
            if now >= next_backends and paced.at + SCRAPE_EVERY - now > SAMPLE_CLEAR:
                backends.sample()
                next_backends += BACKENDS_EVERY
            time.sleep(0.01)
        paced.next()
        late.append(time.monotonic() - paced.at)
        scrapes.append(scrape(lw)[0])  # each the first after a new cycle, as Prometheus's
        backends.refresh()  # sessions opened since (a reconnect, a leader lock taken late)
    paced.wait_next()
    late.append(time.monotonic() - paced.at)
    took, after = scrape(lw)
    scrapes.append(took)
    cpu = cpu_seconds(lw.proc.pid) - cpu0
    backends.refresh()
    wall = time.monotonic() - t0
    backend = backends.seconds()
    # The first reading is parsed only now: parsing 80,000 series three times on an
    # overloaded host sent the first measured scrape 1.4 s after its place on the pace.
    cycles_before = sample_values(before, "lagwatch_cycles_total")[""]
    overruns_before = sample_values(before, "lagwatch_cycle_overruns_total")[""]
    buckets_before = cycle_buckets(before)
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
    # What must never happen under stress: every replica here is healthy (max_lag 10 s) and
    # every node up, so any eject since the start, or a node read down, is a wrong act.
    ejects = sum(float(line.rsplit(" ", 1)[1]) for line in after.splitlines()
                 if line.startswith("lagwatch_pool_changes_total{") and 'action="eject"' in line)
    down = sum(1 for line in after.splitlines()
               if line.startswith("lagwatch_up{") and float(line.rsplit(" ", 1)[1]) == 0)
    made = {when: _renders(after, when) - _renders(before, when) for when in ("ahead", "asked")}
    said_renders = (f", /metrics renders while measured: {made['ahead']:.0f} ahead, {made['asked']:.0f} asked"
                    if "lagwatch_http_metrics_renders_total" in after else "")  # builds before the counter have none
    print(f"  {clusters} x 3 {arm}: healthy replicas ejected since start {ejects:.0f}, nodes read down now {down}"
          f"{said_renders}; measured scrapes sent at most {1000 * max(late):.0f} ms after their place on the pace",
          flush=True)
    return Row(clusters, arm, pass_no, converged, 100 * cpu / wall, 1000 * cpu / max(1, cycles * clusters * 3),
               1000 * bucket_quantile(0.5, buckets_before, buckets_after),
               1000 * bucket_quantile(0.99, buckets_before, buckets_after),
               cycles_over(0.5, buckets_before, buckets_after),  # half the 1 s interval
               rss, 1000 * statistics.median(scrapes) if scrapes else float("nan"),
               1000 * max(scrapes, default=float("nan")), 1000 * statistics.median(renders), series,
               100 * backend / wall, cpu / backend if backend > 0 else float("nan"),
               dict(backends.sessions), dict(backends.leaders), cluster.primary.name,
               sample_values(after, "lagwatch_cycle_overruns_total")[""] - overruns_before)


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
    parser.add_argument("--arms", default=",".join(ARMS),
                        help="comma-separated arms, alternated within each pass: plain (no pool control), "
                             "pool (every cluster under pool control)")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="measured time per fleet size (a multiple of the 15 s scrape interval)")
    parser.add_argument("--settle", type=float, default=30.0,
                        help="time after convergence before measuring (scraped every 15 s meanwhile; at least 30)")
    parser.add_argument("--passes", type=int, default=1,
                        help="passes; every other one with the sizes and the arms in reverse order")
    parser.add_argument("--busy", type=int, default=0,
                        help="CPU-bound neighbour processes running through each run (from before lagwatch starts)")
    parser.add_argument("--lag-from-wal", choices=("auto", "off"), default="auto",
                        help="every cluster's lag_from_wal (the WAL dating's cost at fleet scale)")
    parser.add_argument("--log-dir", type=Path, default=None,
                        help="keep each run's lagwatch log here, the web server's lines at DEBUG (why each /metrics "
                             "was rendered ahead or when asked)")
    parser.add_argument("--soak", action="store_true", help="print RSS every minute (use with a long --seconds)")
    parser.add_argument("--pg-major", type=int, default=None)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a checkout of another build (git worktree add DIR REV): each run is made with it too, "
                             "alternated, and their CPU per node-cycle compared")
    args = parser.parse_args()
    global LAG_FROM_WAL
    LAG_FROM_WAL = args.lag_from_wal
    sizes = [int(n) for n in args.clusters.split(",")]
    arms = [a.strip() for a in args.arms.split(",")]
    if not arms or any(a not in ARMS for a in arms) or len(set(arms)) != len(arms):
        parser.error(f"--arms: a comma-separated list of distinct arms from {', '.join(ARMS)}")
    if args.busy < 0:
        parser.error("--busy must not be negative")
    if args.log_dir is not None:
        args.log_dir.mkdir(parents=True, exist_ok=True)
    binaries = find_binaries(args.pg_major)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()},"
          f" PostgreSQL {binaries.major}; every cluster = the same primary + 2 replicas; interval 1s; "
          f"{args.seconds:.0f}s measured after {args.settle:.0f}s; arms {', '.join(arms)}; "
          f"{args.busy} busy neighbours", flush=True)
    rows: list[Row] = []
    with FleetCluster(binaries, replicas=2) as cluster, Commits(cluster.primary):
        for n in range(args.passes):
            forward = n % 2 == 0
            for size in sizes if forward else list(reversed(sizes)):
                for arm in arms if forward else list(reversed(arms)):
                    builds: list[Path | None] = [None] if args.baseline is None else [None, args.baseline / "daemon"]
                    for daemon in builds if (n + sizes.index(size)) % 2 == 0 else list(reversed(builds)):
                        row = measure(cluster, size, arm, n, args.seconds, args.settle, args.soak, args.busy, daemon,
                                      args.log_dir)
                        rows.append(row)
                        print(_format(row), flush=True)
    print()
    _print_table(rows)
    print()
    _print_targets(rows, sizes)
    if args.baseline is not None:
        print()
        _print_against_baseline(rows, sizes, arms)
    return 0


def _print_against_baseline(rows: list[Row], sizes: list[int], arms: list[str]) -> None:
    """Per size and arm: CPU per node-cycle of this build against the baseline's, the runs
    alternated (the order of the builds swapped every pass and size)."""
    print("| clusters x nodes | arm | CPU ms per node-cycle, this build (mean) | baseline (mean) | this / baseline |")
    print("|---|---|---|---|---|")
    for size in sizes:
        for arm in arms:
            new = [r.cpu_ms_per_node_cycle for r in rows if r.clusters == size and r.arm == arm]
            base = [r.cpu_ms_per_node_cycle for r in rows if r.clusters == size and r.arm == f"{arm}@base"]
            if new and base:
                ratio = statistics.mean(new) / statistics.mean(base)
                print(f"| {size} × 3 | {arm} | {statistics.mean(new):.4f} ({', '.join(f'{v:.4f}' for v in new)}) | "
                      f"{statistics.mean(base):.4f} ({', '.join(f'{v:.4f}' for v in base)}) | {ratio:.3f} |")


def _print_table(rows: list[Row]) -> None:
    print("| clusters x nodes | arm | pass | converged | CPU (% of one core) | CPU ms per node-cycle | "
          "cycle median / p99 (estimated) | cycles > 500 ms | overruns | RSS | "
          "/metrics at Prometheus's pace (median / max) | off-pace /metrics | series | servers' backend CPU | "
          "cpu_ratio | sessions per server (leader) | nodes per server |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row.clusters} × 3 | {row.arm} | {row.pass_no} | {row.converged_s:.1f} s | {row.cpu_percent:.1f} % | "
              f"{row.cpu_ms_per_node_cycle:.3f} | {row.cycle_median_ms:.1f} / {row.cycle_p99_ms:.1f} ms | "
              f"{row.cycles_over_half:.0f} | {row.overruns:.0f} | {row.rss_mb:.0f} MB | "
              f"{row.scrape_ms:.1f} / {row.scrape_max_ms:.1f} ms | {row.render_ms:.1f} ms | {row.series:,} | "
              f"{row.backend_cpu_percent:.1f} % | {row.cpu_ratio:.2f} | {_sessions(row)} | {row.clusters} |")


def _print_targets(rows: list[Row], sizes: list[int]) -> None:
    """Per size, pool control's cost and each figure beside its target (met or not)."""
    print(f"| clusters x nodes | pool control adds CPU (≤ {100 * TARGET_POOL_CPU_ADDED:.0f} %) | "
          f"converged, slowest (≤ {TARGET_CONVERGED_S:.0f} s) | "
          "sessions per server, most (nodes + at most one per primary server) | overruns (0) | "
          f"cpu_ratio, mean (≤ {TARGET_CPU_RATIO}) |")
    print("|---|---|---|---|---|---|")
    for size in sizes:
        of_size = [r for r in rows if r.clusters == size]
        by_pass: dict[int, dict[str, Row]] = {}
        for r in of_size:
            by_pass.setdefault(r.pass_no, {})[r.arm] = r
        added = [arms["pool"].cpu_percent / arms["plain"].cpu_percent - 1
                 for arms in by_pass.values() if {"plain", "pool"} <= arms.keys() and arms["plain"].cpu_percent > 0]
        if added:
            mean = statistics.mean(added)
            cost = f"{100 * mean:+.1f} % ({_met(mean <= TARGET_POOL_CPU_ADDED)}; per pass " \
                   f"{', '.join(f'{100 * a:+.1f}' for a in added)})"
        else:
            cost = "n/a (needs both arms)"
        cells: dict[str, list[str]] = {"converged": [], "sessions": [], "overruns": [], "ratio": []}
        for arm in ARMS:
            mine = [r for r in of_size if r.arm == arm]
            if not mine:
                continue
            never = any(math.isnan(r.converged_s) for r in mine)
            slowest = float("nan") if never else max(r.converged_s for r in mine)
            cells["converged"].append(f"{arm} {slowest:.1f} s ({_met(slowest <= TARGET_CONVERGED_S)})")
            worst = max(mine, key=lambda r: sum(r.sessions.values()))
            cells["sessions"].append(f"{arm} {_sessions(worst)} for {size} nodes per server "
                                     f"({_met(all(r.sessions_within_target() for r in mine))})")
            overruns = sum(r.overruns for r in mine)
            cells["overruns"].append(f"{arm} {overruns:.0f} ({_met(overruns == 0)})")
            ratio = statistics.mean(r.cpu_ratio for r in mine)
            cells["ratio"].append(f"{arm} {ratio:.2f} ({_met(ratio <= TARGET_CPU_RATIO)})")
        print(f"| {size} × 3 | {cost} | " + " | ".join("; ".join(c) for c in cells.values()) + " |")


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _sessions(row: Row) -> str:
    return " / ".join(f"{n}{'*' if name == row.primary else ''}"
                      + (f" ({row.leader_sessions[name]})" if row.leader_sessions[name] else "")
                      for name, n in row.sessions.items())


def _format(row: Row) -> str:
    return (f"{row.clusters:4d} x 3 {row.arm:5s} (pass {row.pass_no}): converged {row.converged_s:.1f} s, "
            f"CPU {row.cpu_percent:5.1f} %, {row.cpu_ms_per_node_cycle:.3f} ms/node-cycle, "
            f"cycle {row.cycle_median_ms:.1f}/{row.cycle_p99_ms:.1f} ms ({row.cycles_over_half:.0f} over 500 ms), "
            f"overruns {row.overruns:.0f}, RSS {row.rss_mb:.0f} MB, scrape {row.scrape_ms:.1f}/{row.scrape_max_ms:.1f} "
            f"ms, off-pace {row.render_ms:.1f} ms, {row.series} series, backends {row.backend_cpu_percent:.1f} %, "
            f"cpu_ratio {row.cpu_ratio:.2f}, sessions {_sessions(row)} (nodes per server {row.clusters})")


if __name__ == "__main__":
    sys.exit(main())
