"""Benchmark: from pg_wal_replay_pause() under writes to the replica's host leaving
PgBouncer's SHOW DATABASES. Median and max of N trials. Target (issue 2/4) at interval 1s,
eject_after 2, max_lag 1s: median under 4 s. Prints figures; asserts nothing.

    python3 bench/eject.py [--trials 10] [--pg-major 15]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "daemon"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from harness import Lagwatch, Writer, cluster_config  # noqa: E402
from lagwatch.demo.binaries import find_binaries  # noqa: E402
from lagwatch.demo.cluster import LocalCluster  # noqa: E402
from lagwatch.demo.ports import free_port  # noqa: E402
from pgbouncer_server import PgBouncerServer, readable_by_servers  # noqa: E402

INTERVAL, EJECT_AFTER, MAX_LAG = "1s", 2, "1s"


def hosts(pgbouncer: PgBouncerServer) -> list[str]:
    return str(pgbouncer.show_databases()["app_ro"]["host"]).split(",")


def wait(predicate: object, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():  # type: ignore[operator]
            return time.monotonic()
        time.sleep(0.02)
    raise RuntimeError("timed out")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--pg-major", type=int, default=None)
    args = parser.parse_args()
    binaries = find_binaries(args.pg_major)
    with LocalCluster(binaries, replicas=2) as cluster, tempfile.TemporaryDirectory() as tmp:
        cluster.start()
        r1, r2 = cluster.replicas
        pgb = PgBouncerServer(primary_dsn_entry=f"host=127.0.0.1 port={cluster.primary.port} dbname=postgres")
        pgb.include_file.write_text(f"app_ro = host={r1.host},{r2.host} port={r1.port} dbname=postgres\n")
        readable_by_servers(pgb.include_file)
        with pgb:
            config = cluster_config(cluster, free_port(["127.0.0.1"]), interval=INTERVAL, window="1m",
                                    state_dir=str(Path(tmp) / "state"))
            config["clusters"][0].update({
                "sla": {"max_lag": MAX_LAG, "eject_after": EJECT_AFTER, "readmit_below": "500ms",
                        "readmit_after": 2, "min_replicas": 1},
                "pooler": {"kind": "pgbouncer", "admin_dsn": pgb.admin_dsn, "include_file": str(pgb.include_file),
                           "database": "app_ro", "options": f"port={r1.port} dbname=postgres"},
            })
            lw = Lagwatch(Path(tmp), config)
            times: list[float] = []
            try:
                lw.wait_ready()
                for trial in range(args.trials):
                    with Writer(cluster, every=0.05):
                        time.sleep(0.5)  # writes are flowing (and replayed) before the pause
                        paused_at = time.monotonic()
                        r1.pause_replay()
                        left = wait(lambda: r1.host not in hosts(pgb), 30)
                        times.append(left - paused_at)
                    r1.resume_replay()
                    wait(lambda: r1.host in hosts(pgb), 60)
                    # Readmission happens on a cycle: start the next pause at a random phase
                    # of the interval, as a real stall would.
                    time.sleep(1 + random.random())
                    print(f"trial {trial + 1}: {times[-1]:.2f} s", flush=True)
            finally:
                lw.stop()
    print(f"PostgreSQL {binaries.major}, PgBouncer 1.18; interval {INTERVAL}, eject_after {EJECT_AFTER}, "
          f"max_lag {MAX_LAG}")
    print(f"pause-to-eject over {len(times)} trials: median {statistics.median(times):.2f} s, "
          f"max {max(times):.2f} s (target: median < 4 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
