"""Benchmark: what a cycle costs a replica, with and without reading why it is behind.

Starts a primary with one streaming replica (and ``--sessions`` idle sessions on the
replica, as a read pool keeps), then runs a replica's per-cycle statement on one connection,
as lagwatch does (prepared, one round trip), in three arms rotated every round so drift
falls on each alike:

- ``before``: the views a replica read before views/recovery.py (server, wal_receiver);
- ``after``: with the recovery view: the startup process read by its pid (the probe keeps
  it in the session), the conflicts by type, pg_stat_io on 16+;
- ``scan``: the same, the startup process found by listing every session (what reading
  pg_stat_activity costs: the recovery view's fallback without the probe's setting).

Per arm it prints the replica backend's CPU per poll (from /proc) and the wall time per
poll, the median over rounds with the spread; ``before`` is the same-run reference. Round
trips: one a cycle in every arm (the views are one statement). It prints; it asserts nothing.

    python3 bench/replicacost.py [--pg-major 18] [--sessions 200] [--polls 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "daemon"))

import psycopg  # noqa: E402
from lagwatch import rooms  # noqa: E402
from lagwatch.demo.binaries import find_binaries  # noqa: E402
from lagwatch.demo.cluster import LocalCluster  # noqa: E402
from lagwatch.demo.servers import LocalServer  # noqa: E402
from lagwatch.views import probe, recovery, server, startup_io, wal_receiver  # noqa: E402
from lagwatch.views.base import View  # noqa: E402
from lagwatch.views.cadence import Cadence  # noqa: E402
from lagwatch.views.combined import combined_sql  # noqa: E402
from lagwatch.views.probe import Capabilities  # noqa: E402
from psycopg.rows import dict_row  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
ARMS = ("before", "after", "scan")


def backend_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def measure(conn: psycopg.Connection, sql: bytes | Sequence[bytes], polls: int) -> tuple[float, float]:
    """(backend CPU µs, wall µs) per poll of ``sql``, prepared as lagwatch prepares it (a
    sequence: poll n runs its n-th statement, round and round, as a cadence chooses them)."""
    pid = conn.info.backend_pid
    cycle = [sql] if isinstance(sql, bytes) else list(sql)
    for n in range(20):
        conn.execute(cycle[n % len(cycle)], prepare=True)  # warm: prepared, caches filled
    cpu0, t0 = backend_cpu(pid), time.perf_counter()
    for n in range(polls):
        conn.execute(cycle[n % len(cycle)], prepare=True)
    wall = time.perf_counter() - t0
    return (backend_cpu(pid) - cpu0) / polls * 1e6, wall / polls * 1e6


def probed(conn: psycopg.Connection) -> Capabilities:
    """What lagwatch's probe learns of this connection (the SQL it then chooses follows it)."""
    with conn.cursor(row_factory=dict_row) as cur:
        return probe.parse(cur.execute(probe.sql(rooms.probe_columns())).fetchall())


def cadenced(views: Sequence[View[Any]], caps: Capabilities) -> list[bytes]:
    """The statements a connection runs poll after poll for ``views``, as lagwatch's cadence
    chooses them (views/cadence.py), one full turn of it."""
    cadence, applying = Cadence(), tuple(views)
    turn = math.lcm(*(v.every for v in applying))
    return [combined_sql(cadence.choose(applying, n), caps) for n in range(turn)]


def run_rotated(conns: dict[str, psycopg.Connection], sqls: dict[str, bytes | Sequence[bytes]], rounds: int,
                polls: int) -> dict[str, list[tuple[float, float]]]:
    """Each arm's (CPU µs, wall µs) per poll, round after round, the arms' order rotated each
    round so that drift on a shared machine falls on every arm alike."""
    arms = list(sqls)
    results: dict[str, list[tuple[float, float]]] = {arm: [] for arm in arms}
    for r in range(rounds):
        for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
            results[arm].append(measure(conns[arm], sqls[arm], polls))
    return results


def print_table(results: dict[str, list[tuple[float, float]]]) -> None:
    print(f"{'arm':<14} {'server CPU/poll (median, min-max)':>36} {'wall/poll':>22}")
    for arm, runs in results.items():
        cpu = [c for c, _ in runs]
        wall = [w for _, w in runs]
        print(f"{arm:<14} {statistics.median(cpu):>12.1f} µs ({min(cpu):6.1f}-{max(cpu):6.1f}) "
              f"{statistics.median(wall):>12.1f} µs ({min(wall):6.1f}-{max(wall):6.1f})")


def cost_arguments(doc: str | None) -> argparse.Namespace:
    """The cost benches' command line (this one's and primarycost.py's)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg-major", type=int, default=None)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--polls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    return parser.parse_args()


def room_for(servers: list[LocalServer], sessions: int) -> None:
    """``sessions`` idle sessions more on these servers (a standby must allow at least the
    primary's max_connections: the replica first)."""
    for node in servers:
        node.alter_system("max_connections", str(max(100, sessions + 20)))
        node.stop()
        node.start()


def main() -> int:
    args = cost_arguments(__doc__)
    binaries = find_binaries(args.pg_major)
    with LocalCluster(binaries, replicas=1) as cluster:
        replica = cluster.replicas[0]
        room_for([replica], args.sessions)
        idle = [psycopg.connect(replica.dsn(), autocommit=True) for _ in range(args.sessions)]
        conns = {arm: psycopg.connect(replica.dsn(), autocommit=True) for arm in ARMS}
        for arm in ("before", "after"):
            conns[arm].execute(probe.SQL)  # keeps the startup pid in the session (the scan arm has none)
        caps = probed(conns["after"])
        version = caps.version_num
        before = combined_sql([server.VIEW, wal_receiver.VIEW], caps)
        # With the recovery view, and pg_stat_io's startup reads one poll in ten (16+), as lagwatch reads them.
        after = cadenced([server.VIEW, wal_receiver.VIEW, recovery.VIEW]
                         + ([startup_io.VIEW] if version >= 160000 else []), caps)
        sqls = {"before": before, "after": after, "scan": after}
        print(f"PostgreSQL {binaries.major}, a replica with {args.sessions} idle sessions; {args.rounds} rounds of "
              f"{args.polls} polls per arm, rotated; one round trip a cycle in every arm")
        print_table(run_rotated(conns, sqls, args.rounds, args.polls))
        for conn in [*idle, *conns.values()]:
            conn.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
