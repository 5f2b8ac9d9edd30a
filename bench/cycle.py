"""Benchmark: poll cycle duration, /metrics scrape duration and daemon RSS.

Starts a real primary with two streaming replicas and a real `lagwatch run`, lets it poll
under a light write load, and prints figures. Targets (issue 1/4): cycle < 20 ms,
scrape < 5 ms, RSS < 60 MB. It prints; it asserts nothing.

    python3 bench/cycle.py [--seconds 20] [--scrapes 500] [--pg-major 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "daemon"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from harness import Lagwatch, Writer  # noqa: E402
from lagwatch.demo.binaries import find_binaries  # noqa: E402
from lagwatch.demo.cluster import LocalCluster  # noqa: E402


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="how long to let it poll")
    parser.add_argument("--scrapes", type=int, default=500)
    parser.add_argument("--pg-major", type=int, default=None)
    args = parser.parse_args()

    binaries = find_binaries(args.pg_major)
    with LocalCluster(binaries, replicas=2) as cluster, tempfile.TemporaryDirectory() as tmp:
        cluster.start()
        lw = Lagwatch.for_cluster(Path(tmp), cluster, interval="250ms", window="5m")
        try:
            lw.wait_ready()
            cycles: list[float] = []
            with Writer(cluster, every=0.05, max_seconds=args.seconds + 5):
                deadline = time.monotonic() + args.seconds
                last_cycle = None
                while time.monotonic() < deadline:
                    total = lw.daemon_value("lagwatch_cycles_total")
                    if total != last_cycle:
                        last_cycle = total
                        duration = lw.daemon_value("lagwatch_cycle_duration_seconds")
                        if duration is not None:
                            cycles.append(duration)
                    time.sleep(0.25)
            scrape: list[float] = []
            url = lw.url("/metrics")
            for _ in range(args.scrapes):
                started = time.perf_counter()
                with urllib.request.urlopen(url, timeout=5) as response:
                    response.read()
                scrape.append(time.perf_counter() - started)
            rss = rss_mb(lw.proc.pid)
        finally:
            lw.stop()
    print(f"PostgreSQL {binaries.major}, primary + 2 replicas, interval 250ms, writes every 50ms")
    print(f"poll cycle     median {statistics.median(cycles) * 1000:7.2f} ms   max {max(cycles) * 1000:7.2f} ms"
          f"   ({len(cycles)} cycles; target < 20 ms)")
    print(f"/metrics       median {statistics.median(scrape) * 1000:7.2f} ms   p95 "
          f"{statistics.quantiles(scrape, n=20)[-1] * 1000:7.2f} ms   ({len(scrape)} scrapes; target < 5 ms)")
    print(f"daemon RSS     {rss:7.1f} MB   (target < 60 MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
