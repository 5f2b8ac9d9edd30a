"""Benchmark: a ready /metrics answer while the cycle's thread holds the GIL, by switch interval.

lagwatch's HTTP server runs on threads of its own (an event loop, a few workers), while a
fleet's cycle keeps the main thread busy in Python for most of each second. Each step of
an answer (accept, read the request, every write as the socket drains) has to take the GIL
back from the cycle's thread, which gives it up only when asked, after CPython's switch
interval: 5 ms by default, and a scrape takes a dozen such steps or more. lagwatch sets
0.5 ms (lagwatch/runner.py); ``--also`` measures others beside it (0.2 ms by default).

This bench isolates that: lagwatch's own ``HttpServer`` in this process, serving a body
made beforehand (the sizes of a 300 x 3 fleet's exposition: text, protobuf and gzip), while
a thread spins in Python as a cycle does. Blocks of scrapes at each switch interval
alternate (the order reversed every round), so both see the same host in the same
minutes. Each scrape is curl's (connect to last byte, and its first byte); beside each
figure, the spinning thread's work per second in that block: what the shorter interval
costs the cycle. ``--busy N`` adds N CPU-bound processes (busy loops) for the whole run.
It prints; it asserts nothing.

    python3 bench/switch.py [--rounds 4] [--scrapes 10] [--busy 0]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "daemon"))

from lagwatch.config import HttpConfig  # noqa: E402
from lagwatch.runner import SWITCH_INTERVAL  # noqa: E402
from lagwatch.serve.httpmessages import Request, Response  # noqa: E402
from lagwatch.serve.httpserver import HttpServer  # noqa: E402

CPYTHON_DEFAULT = 0.005
# A 300 x 3 fleet's /metrics (docs/benchmarks.md, "A fleet's scrape in every format").
BODIES = {"text": 6_780_000, "protobuf": 4_160_000, "text, gzip": 385_000}


class Spinner:
    """A thread doing pure-Python work without pause, as a fleet's cycle does; counts it."""

    def __init__(self) -> None:
        self.work = 0
        self._stop = False
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        while not self._stop:
            total = 0
            for i in range(1000):
                total += i * i
            self.work += 1

    @property
    def started(self) -> bool:
        return self._thread.ident is not None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop = True
        self._thread.join()


def scrape(url: str) -> tuple[float, float]:
    """curl's first byte and last byte, ms from its connect."""
    out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{time_starttransfer} %{time_total}", url],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    first, total = map(float, out.split())
    return first * 1000, total * 1000


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--scrapes", type=int, default=10, help="scrapes a block")
    parser.add_argument("--busy", type=int, default=0, help="CPU-bound processes beside it")
    parser.add_argument("--also", type=float, action="append", default=None,
                        help="another switch interval to measure (seconds; repeatable; 0.0002 if none)")
    args = parser.parse_args()

    bodies = {name: os.urandom(size) for name, size in BODIES.items()}

    def handle(request: Request) -> Response:
        return Response(200, bodies[request.path.strip("/").replace("-", ", ")], "application/octet-stream")

    intervals = tuple(dict.fromkeys((CPYTHON_DEFAULT, SWITCH_INTERVAL, *(args.also or [0.0002]))))
    figures: dict[tuple[float, str], list[tuple[float, float]]] = {(si, b): [] for si in intervals for b in bodies}
    work: dict[float, list[float]] = {si: [] for si in intervals}
    server = HttpServer("127.0.0.1", 0, handle, limits=lambda: HttpConfig())
    server.start()
    spinner = Spinner()
    neighbours: list[subprocess.Popen[bytes]] = []
    try:
        neighbours += [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
        spinner.start()
        for rnd in range(args.rounds):
            for si in intervals if rnd % 2 == 0 else intervals[::-1]:
                sys.setswitchinterval(si)
                began, work_before = time.monotonic(), spinner.work
                for _ in range(args.scrapes):
                    for name in bodies:
                        figures[si, name].append(scrape(f"http://127.0.0.1:{server.port}/{name.replace(', ', '-')}"))
                        time.sleep(0.05)
                work[si].append((spinner.work - work_before) / (time.monotonic() - began))
    finally:
        if spinner.started:
            spinner.stop()
        for neighbour in neighbours:
            neighbour.kill()
            neighbour.wait()
        server.stop()

    print(f"{args.rounds} rounds x {args.scrapes} scrapes a body, {args.busy} CPU-bound process(es) beside it, "
          f"{os.cpu_count()} cores, Python {sys.version.split()[0]}")
    print("| switch interval | body | bytes | first byte, median / p95 ms | last byte, median / p95 ms |")
    print("|---|---|---|---|---|")
    for si in intervals:
        for name, body in bodies.items():
            first = [f for f, _ in figures[si, name]]
            total = [t for _, t in figures[si, name]]
            print(f"| {si * 1000:g} ms | {name} | {len(body):,} | {statistics.median(first):.1f} / {p95(first):.1f} "
                  f"| {statistics.median(total):.1f} / {p95(total):.1f} |")
    base = statistics.median(work[CPYTHON_DEFAULT])
    for si in intervals:
        rate = statistics.median(work[si])
        print(f"the cycle-like thread's work at {si * 1000:g} ms: {rate:,.0f} units/s "
              f"({rate / base:.3f} of the {CPYTHON_DEFAULT * 1000:g} ms blocks')")


if __name__ == "__main__":
    main()
