"""Benchmark: how long a `lagwatch run` takes to exit after SIGTERM.

systemd waits TimeoutStopSec for a service to stop, and a restart waits for the stop: a
monitor that lingers on its way out delays its own restart. Starts a primary with two
streaming replicas, then N times: a lagwatch on them at ``--interval``, ready and a few
cycles in, then SIGTERM, timed until the process is gone (its exit code printed beside).
Prints each time and their median and max, with the same run's reference: how long the
primary itself takes to stop (pg_ctl stop -m fast) on the same host. It prints; it
asserts nothing. The suite (tests/integration/test_cli_process.py) keeps the correctness
half: SIGTERM ends it with exit code 0 and no traceback.

    python3 bench/shutdown.py [--runs 10] [--interval 1s] [--pg-major 15]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "daemon"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from chaoscluster import ChaosCluster  # noqa: E402
from harness import Lagwatch  # noqa: E402
from lagwatch.demo.binaries import find_binaries  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--interval", default="1s")
    parser.add_argument("--pg-major", type=int, default=15)
    args = parser.parse_args()
    exits, codes = [], []
    with ChaosCluster(find_binaries(args.pg_major), replicas=2) as cluster, \
            tempfile.TemporaryDirectory(prefix="lw-shutdown-") as folder:
        for run in range(args.runs):
            workdir = Path(folder) / f"run{run}"
            workdir.mkdir()
            lw = Lagwatch.for_cluster(workdir, cluster, interval=args.interval)
            lw.wait_ready()
            lw.wait_cycles(3)
            started = time.monotonic()
            lw.signal(signal.SIGTERM)
            codes.append(lw.proc.wait(60))
            exits.append(time.monotonic() - started)
            print(f"run {run + 1}: exited in {exits[-1] * 1000:.0f} ms, code {codes[-1]}")
        started = time.monotonic()
        cluster.primary.stop()  # the reference: PostgreSQL's own fast stop on this host now
        reference = time.monotonic() - started
        cluster.primary.start()
    print(f"\nlagwatch after SIGTERM (interval {args.interval}, {args.runs} runs): median "
          f"{statistics.median(exits) * 1000:.0f} ms, max {max(exits) * 1000:.0f} ms; exit codes {sorted(set(codes))}")
    print(f"reference, the same run: the primary's pg_ctl stop -m fast took {reference * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
