"""Benchmark: a flood of eager scrapers against a real `lagwatch run`.

Starts a primary with two streaming replicas and one lagwatch on them, then opens N
concurrent scrapers (500 by default) that each connect, GET /metrics and close, again and
again, for S seconds. Prints how many scrapes were served, the connect-time percentiles
and the slowest, failures, and lagwatch's RSS at the start, after the first seconds and at
the end (flat memory: the end matches the early reading). It prints; it asserts nothing.
The suite (tests/integration/test_http_hostile.py) keeps the correctness half: 1,100 slow
clients never starve a scrape.

    python3 bench/scrapers.py [--scrapers 500] [--seconds 20] [--pg-major 15]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "daemon"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from harness import Lagwatch  # noqa: E402
from lagwatch.demo.binaries import find_binaries  # noqa: E402
from lagwatch.demo.cluster import LocalCluster  # noqa: E402


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def flood(port: int, pid: int, scrapers: int, seconds: float) -> tuple[list[float], list[str], list[float]]:
    connects: list[float] = []
    failures: list[str] = []
    rss: list[float] = []
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds

    async def scraper() -> None:
        while loop.time() < until:
            started = loop.time()
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
            except (OSError, TimeoutError) as exc:
                failures.append(f"connect: {exc!r}")
                continue
            connects.append(loop.time() - started)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: lagwatch\r\nConnection: close\r\n\r\n")
            try:
                data = await asyncio.wait_for(reader.read(), 10)
                if not data.startswith(b"HTTP/1.1 200"):
                    failures.append(data[:60].decode(errors="replace"))
            except (OSError, TimeoutError) as exc:
                failures.append(f"read: {exc!r}")
            finally:
                writer.close()

    async def sample_memory() -> None:
        while loop.time() < until:
            rss.append(rss_mb(pid))
            await asyncio.sleep(1)

    await asyncio.gather(sample_memory(), *(scraper() for _ in range(scrapers)))
    return connects, failures, rss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scrapers", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--pg-major", type=int, default=None)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 4 * args.scrapers), hard), hard))

    with LocalCluster(find_binaries(args.pg_major), replicas=2) as cluster, tempfile.TemporaryDirectory() as tmp:
        cluster.start()
        lw = Lagwatch.for_cluster(Path(tmp), cluster)  # type: ignore[arg-type]
        try:
            lw.wait_ready()
            connects, failures, rss = asyncio.run(flood(lw.port, lw.proc.pid, args.scrapers, args.seconds))
            up = lw.value("lagwatch_up", node="replica1")
        finally:
            lw.stop()
    cuts = statistics.quantiles(connects, n=100) if len(connects) >= 2 else [float("nan")] * 99
    early = rss[min(4, len(rss) - 1)] if rss else float("nan")
    print(f"{args.scrapers} scrapers for {args.seconds:g} s: {len(connects)} scrapes, {len(failures)} failures"
          f"{' (first: ' + failures[0] + ')' if failures else ''}")
    slowest = max(connects, default=0.0)
    print(f"connect ms: p50 {cuts[49] * 1000:.1f}, p99 {cuts[98] * 1000:.1f}, max {slowest * 1000:.1f}")
    print(f"lagwatch RSS MB: start {rss[0] if rss else float('nan'):.0f}, after 4 s {early:.0f}, "
          f"end {rss[-1] if rss else float('nan'):.0f}; polling went on: {up == 1}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
