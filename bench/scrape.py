"""Benchmark: a fleet's /metrics as an outside scraper sees it, in every format and coding.

One lagwatch watching ``--clusters`` clusters of 3 nodes (the same primary and two
replicas, as bench/fleet.py) at ``interval: 1s``. A scraper keeps Prometheus's habit: a
fixed pace (``--every``, 3 s by default: a 15 s pace gives the same per-scrape figures, five
times slower to gather), started three scrapes before measuring so that lagwatch knows
the pace. Each variant is a format (the ``Accept`` header Prometheus sends for it) with and
without ``Accept-Encoding: gzip``; the variants take turns in blocks of five scrapes (as a
Prometheus keeps one format; the first scrape of a block, a change of format, not counted),
their order reversed every other round, so every one sees the same host. Each scrape is
made by curl (the process's start is not counted: curl's own ``time_total``, from its
connect to the last byte; and its first byte). Where gzip is asked, to the last compressed
byte, as the answer arrives: inflating it is the scraper's own work (curl does it after
each piece arrives, into /dev/null here), printed apart, once per format, timed in this
process on the same body. ``--inflate`` counts it in each scrape instead (curl
``--compressed``: how figures before 2026-11-29's second run were taken).

Printed for each variant: the scrapes' median and p95 (ms), the first byte's median, the
bytes on the wire, the content type answered. Beside each, the same-run reference: the static twin
(bench/static_target.py, lagwatch's bodies written once and served as they are by a
process that does nothing else), scraped the same way half a pace after each counted
scrape: what the host itself takes to move those bytes to curl at that moment. Then,
alone at the same pace, a real Prometheus (Debian's 2.42: OpenMetrics in gzip, then with
native histograms on: protobuf in gzip) scraping lagwatch and the twin for ``--scrapes``
scrapes: the median and p95 of its own ``scrape_duration_seconds`` for each (which holds
Prometheus's own parsing and storing of the series: the twin's figure is that part), and
of its scrapes' answers timed on the wire (bench/wiretime.py: tcpdump on the loopback, from
its request's packet to the answer's last; needs Debian's ``tcpdump``, left out without it).
``--busy 1`` runs one CPU-bound neighbour (a busy loop) for the whole measurement. It
prints; it asserts nothing. Targets (issue 5/6): paced median under 25 ms on a quiet host
and under 50 ms beside one CPU-bound process, in every format.

``--compare DIR`` runs a second lagwatch from another checkout's ``daemon/`` (the old
build) on the same fleet, both at once: each variant's block is scraped from one, then
the other (which first, alternated every round), and one Prometheus scrapes both; every
figure is printed for each build, measured on the same host in the same minutes.

    python3 bench/scrape.py [--clusters 300] [--scrapes 8] [--every 3] [--busy 0] [--compare DIR]
"""

from __future__ import annotations

import argparse
import gzip as gzip_module
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib
from pathlib import Path
from typing import NamedTuple

from fleet import CONVERGE_TIMEOUT, Commits, FleetCluster, Neighbours, fleet_config, wait_converged
from harness import Lagwatch
from lagwatch.demo.binaries import find_binaries
from lagwatch.demo.ports import free_port
from prom_stack import Prometheus
from wiretime import WireClock, available

# The Accept header Prometheus sends for each format (tests/unit/test_negotiation.py quotes them).
BLOCK = 5  # consecutive scrapes of one variant, the first of them not counted

FORMATS = {
    "text 0.0.4": "text/plain;version=0.0.4",
    "text 1.0.0": "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
    "openmetrics": ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"),
    "protobuf": ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,"
                 "application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;"
                 "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"),
}


class Scrape(NamedTuple):
    took: float  # curl's time_total, s: connect to last byte (and inflating, with --inflate)
    first_byte: float  # curl's time_starttransfer, s
    size: int  # bytes on the wire
    content_type: str
    coding: str  # Content-Encoding answered ("" for none)


def curl(url: str, accept: str, gzip: bool, inflate: bool = False) -> Scrape:
    """One scrape as curl makes it. With gzip asked and not ``inflate``, the answer is
    taken as it comes (curl does not inflate what it was not asked to)."""
    argv = ["curl", "-s", "-o", "/dev/null", "-H", f"Accept: {accept}",
            "-w", "%{time_total} %{time_starttransfer} %{size_download} %header{content-encoding}|%{content_type}",
            url]
    if gzip:
        argv[1:1] = ["--compressed"] if inflate else ["-H", "Accept-Encoding: gzip"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    took, first_byte, size, rest = out.split(" ", 3)
    coding, _, content_type = rest.partition("|")
    return Scrape(float(took), float(first_byte), int(size), content_type, coding.strip())


def inflate_ms(url: str, accept: str) -> float:
    """What inflating such an answer costs a scraper: the median of five streaming
    inflates in this process (zlib, fed 16 KiB at a time and the output let go, as curl
    does; Prometheus's Go inflates with its own code, of the same order)."""
    request = urllib.request.Request(url, headers={"Accept": accept, "Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=30) as response:
        packed = response.read()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        inflater = zlib.decompressobj(31)  # 31: a gzip wrapper
        for at in range(0, len(packed), 16384):
            inflater.decompress(packed[at:at + 16384])
        inflater.flush()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def counters(url: str) -> dict[str, float]:
    """lagwatch's own count of how /metrics was served (ready / waited) and rendered (ahead /
    asked), read from a plain scrape (which counts itself too)."""
    text = subprocess.run(["curl", "-s", url], capture_output=True, text=True, timeout=30, check=True).stdout
    out = {}
    for line in text.splitlines():
        if line.startswith(("lagwatch_http_metrics_served_total{", "lagwatch_http_metrics_renders_total{")):
            out[line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
    return out


def said(before: dict[str, float], after: dict[str, float]) -> str:
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    return (f"served from a ready render {delta.get('ready', 0):.0f}, after waiting {delta.get('waited', 0):.0f}; "
            f"renders ahead {delta.get('ahead', 0):.0f}, asked {delta.get('asked', 0):.0f}")


STATIC_TWIN = "static twin"


class StaticTwin:
    """Prometheus's reference: lagwatch's bodies (each format, plain and gzipped, as it
    answered Prometheus's headers once) served as they are by bench/static_target.py in a
    process of its own."""

    def __init__(self, lw: Lagwatch, folder: Path) -> None:
        folder.mkdir()
        for name, accept in (("protobuf", FORMATS["protobuf"]), ("openmetrics", FORMATS["openmetrics"]),
                             ("text1", FORMATS["text 1.0.0"]), ("text", FORMATS["text 0.0.4"])):
            request = urllib.request.Request(lw.url("/metrics"), headers={"Accept": accept})
            with urllib.request.urlopen(request, timeout=30) as response:
                body = response.read()
                (folder / f"{name}.type").write_text(response.headers["Content-Type"])
            (folder / name).write_bytes(body)
            (folder / f"{name}.gz").write_bytes(gzip_module.compress(body, 1, mtime=0))
        port = free_port(["127.0.0.1"])
        self.address = f"127.0.0.1:{port}"
        self._proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("static_target.py")),
                                       str(folder), str(port)])
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    with urllib.request.urlopen(f"http://{self.address}/metrics", timeout=2):
                        return
                except OSError:
                    if time.monotonic() > deadline or self._proc.poll() is not None:
                        raise RuntimeError("the static twin did not start") from None
                    time.sleep(0.1)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clusters", type=int, default=300)
    parser.add_argument("--scrapes", type=int, default=8, help="measured scrapes per variant (a multiple of 4)")
    parser.add_argument("--every", type=float, default=3.0, help="the scrape pace, seconds (at least the interval)")
    parser.add_argument("--busy", type=int, default=0, help="CPU-bound neighbours through the measurement")
    parser.add_argument("--pg-major", type=int, default=None)
    parser.add_argument("--compare", type=Path, default=None, help="another checkout, run beside this one")
    parser.add_argument("--inflate", action="store_true", help="count curl's inflating of a gzip answer in it")
    args = parser.parse_args()
    variants = [(name, gzip) for name in FORMATS for gzip in (False, True)]
    builds = ["this"] + (["compare"] if args.compare else [])
    binaries = find_binaries(args.pg_major)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"PostgreSQL {binaries.major}; {args.clusters} x 3 nodes at interval 1s; a scrape every {args.every:g} s, "
          f"variants in turn, {args.scrapes} each; {args.busy} busy neighbours", flush=True)
    seen: dict[tuple[str, str, bool], list[Scrape]] = {
        (build, *v): [] for build in [*builds, STATIC_TWIN] for v in variants}
    with FleetCluster(binaries, replicas=2) as cluster, Commits(cluster.primary), \
            tempfile.TemporaryDirectory(prefix="lagwatch-scrape-") as tmp:
        workers: dict[str, Lagwatch] = {}
        neighbours = None
        twin: StaticTwin | None = None
        try:
            for build in builds:
                workdir = Path(tmp) / build
                (workdir / "pools").mkdir(parents=True)
                config = fleet_config(cluster, args.clusters, free_port(["127.0.0.1"]), workdir, pool=False)
                env = {"PYTHONPATH": str(args.compare.resolve() / "daemon")} if build == "compare" else None
                workers[build] = Lagwatch(workdir, config, env=env, log_level="info")
            for lw in workers.values():
                wait_converged(lw, time.monotonic(), args.clusters * 3, 0)
                lw.wait_ready(timeout=CONVERGE_TIMEOUT)
            # Blocks of BLOCK scrapes per variant (and build), the order of the variants
            # reversed every other round, and of the builds too: a Prometheus keeps one
            # format, and lagwatch writes ahead the format and coding the last scrape took, so
            # the first scrape of a block (a change of format) is not counted. Three scrapes
            # of each build first teach it the pace.
            rounds = max(1, round(args.scrapes / (BLOCK - 1)))
            plan = [(build, "text 0.0.4", True) for build in builds for _ in range(3)]
            for r in range(rounds):
                for variant in variants if r % 2 == 0 else list(reversed(variants)):
                    for build in builds if r % 2 == 0 else list(reversed(builds)):
                        plan += [(build, *variant)] * BLOCK
            twin = StaticTwin(workers["this"], Path(tmp) / "twin")
            neighbours = Neighbours(args.busy, len(plan) * args.every + 60)
            before = {build: counters(lw.url("/metrics")) for build, lw in workers.items()}
            start = time.monotonic()
            warmup = 3 * len(builds)
            for n, (build, name, gzip) in enumerate(plan):
                time.sleep(max(0.0, start + n * args.every - time.monotonic()))
                result = curl(workers[build].url("/metrics"), FORMATS[name], gzip, args.inflate)
                if n >= warmup and plan[n - 1] == plan[n]:
                    seen[build, name, gzip].append(result)
                    if build == "this":  # the same scrape of the twin, half a pace later
                        time.sleep(max(0.0, start + (n + 0.5) * args.every - time.monotonic()))
                        seen[STATIC_TWIN, name, gzip].append(curl(f"http://{twin.address}/metrics",
                                                                  FORMATS[name], gzip, args.inflate))
            print_curl(seen)
            if not args.inflate:
                print("A scraper's inflating of each gzip answer (not in the figures above), median ms: " + "; ".join(
                    f"{name} {inflate_ms(f'http://{twin.address}/metrics', FORMATS[name]):.1f}" for name in FORMATS),
                    flush=True)
            for build, lw in workers.items():
                print(f"curl ({build}): {said(before[build], counters(lw.url('/metrics')))}", flush=True)
            by_prometheus = {label: prometheus_scrapes(workers, features, args.every, args.scrapes, twin.address)
                             for label, features in (("Prometheus 2.42 (OpenMetrics, gzip)", ()),
                                                     ("Prometheus 2.42 native histograms (protobuf, gzip)",
                                                      ("native-histograms",)))}
        finally:
            if twin is not None:
                twin.stop()
            if neighbours is not None:
                neighbours.stop()
            for lw in workers.values():
                lw.stop()
    print()
    print(f"The {STATIC_TWIN}: the same series from a server that does nothing else (bench/static_target.py): "
          "Prometheus's own parsing and storing, the part of its figure that is not the target's.")
    print("scrape_duration_seconds; the rows \"on the wire\": Prometheus's request to the answer's last byte, "
          "timed by tcpdump over the same span (bench/wiretime.py).")
    print("| scraper | build | median ms | p95 ms |")
    print("|---|---|---|---|")
    for label, figures in by_prometheus.items():
        for build, (median, p95) in figures.items():
            print(f"| {label} | {build} | {median * 1000:.1f} | {p95 * 1000:.1f} |")
    return 0


def print_curl(seen: dict[tuple[str, str, bool], list[Scrape]]) -> None:
    print("| format | gzip | build | median ms | p95 ms | first byte, median ms | bytes | content type |")
    print("|---|---|---|---|---|---|---|---|")
    order = {"this": 0, "compare": 1, STATIC_TWIN: 2}
    for (build, name, gzip), results in sorted(seen.items(), key=lambda kv: (kv[0][1], kv[0][2], order[kv[0][0]])):
        plain = sum(r.coding != "gzip" for r in results) if gzip else 0
        times = [r.took * 1000 for r in results]
        print(f"| {name} | {'yes' if gzip else 'no'} | {build} | {statistics.median(times):.1f} "
              f"| {percentile(times, 0.95):.1f} | {statistics.median(r.first_byte * 1000 for r in results):.1f} "
              f"| {statistics.median(r.size for r in results):,.0f} | {results[-1].content_type}"
              f"{f' ({plain} answered without gzip)' if plain else ''} |", flush=True)


def prometheus_scrapes(workers: dict[str, Lagwatch], features: tuple[str, ...], every: float,
                       scrapes: int, twin: str) -> dict[str, tuple[float, float]]:
    """A real Prometheus scraping each build at ``every`` (each at its own phase, as it
    spreads its targets) for ``scrapes`` scrapes after three to teach the pace, and the
    static twin (``twin``: the same series from a server that does nothing else): the median
    and p95 of its ``scrape_duration_seconds``, by build, and under ``"<build>, on the
    wire"`` of its answers timed on the wire over the same span."""
    targets = {build: f"127.0.0.1:{lw.port}" for build, lw in workers.items()}
    targets[STATIC_TWIN] = twin
    prometheus = Prometheus(list(targets.values()), [], features=features, scrape_interval=every)
    before = {build: counters(lw.url("/metrics")) for build, lw in workers.items()}
    ports = {build: int(target.rsplit(":", 1)[1]) for build, target in targets.items()}
    wire = WireClock(set(ports.values())) if available() else None
    seen = None
    try:
        if wire is not None:
            try:
                wire.start()  # before Prometheus: from here to wire.stop() only it scrapes these ports
            except RuntimeError as exc:
                print(f"{exc}: no answers timed on the wire", flush=True)
                wire = None
        prometheus.start()
        time.sleep(every * (scrapes + 4))
        if wire is not None:
            seen, wire = wire.stop(), None
            if seen.dropped:
                print(f"tcpdump: {seen.dropped} packets dropped by the kernel", flush=True)
        window_began = time.time() - every * scrapes  # the span quantile_over_time reads below
        for build, lw in workers.items():
            print(f"{features or 'OpenMetrics'} ({build}): {said(before[build], counters(lw.url('/metrics')))}",
                  flush=True)
        span = f"{every * scrapes:g}s"
        figures = {}
        for build, target in targets.items():
            quantiles = []
            for q in (0.5, 0.95):
                expr = f'quantile_over_time({q}, scrape_duration_seconds{{instance="{target}"}}[{span}])'
                result = prometheus.query(expr)["data"]["result"]
                quantiles.append(float(result[0]["value"][1]) if result else float("nan"))
            figures[build] = (quantiles[0], quantiles[1])
            answered = seen.since(ports[build], window_began) if seen is not None else []
            if answered:
                figures[f"{build}, on the wire"] = (statistics.median(answered), percentile(answered, 0.95))
        return figures
    finally:
        if wire is not None:
            wire.stop()
        prometheus.stop()


if __name__ == "__main__":
    sys.exit(main())
