"""Benchmark: how the staleness reading errs under realistic load, by what dates it.

Starts a primary with two streaming replicas and, on the same load at once, six `lagwatch
run` processes: at `interval: 1s` and `100ms`, each with the LSN clock alone
(`lag_from_wal: off`, as a least-privilege role gets), with staleness dated from the WAL's
commits (`lag_from_wal: auto`), and with the WAL dating and a 10 ms heartbeat. The loads,
each with pgbench TPC-B-like at a Poisson rate over four clients and the lag oracle's
writer (tests/integration/loads.py, oracle.py): a steady 40 ms apply delay on replica1; a
big UPDATE amid the load; replay held in bursts (40 ms of every 70); the 40 ms delay with
the host busy with CPU-bound neighbours.

For each load, arm and replica it prints the distribution of reading - truth (median,
p95 and p5 in ms, against the middle of the oracle's interval), the share of readings
below the oracle's proven lower bound by more than max(10 ms, 20 %), and the share above
its proven upper bound by more than max(5 ms, 10 %). The load's own figures (pgbench tps)
are printed beside, the same-run reference. It prints; it asserts nothing.

    python3 bench/lagfield.py [--pg-major 18] [--span 10] [--cases steady,big,bursts,busy]
        [--arms 'lsn clock,wal,wal+heartbeat'] [--intervals 1s,100ms] [--detail]
        [--baseline DIR]

``--baseline DIR``: a checkout of another build (``git worktree add DIR REV``), each arm
run from it too (``ARM@base``), on the same load at once: the same-run comparison of two
builds.

(``--cases bigbusy``: the big UPDATE with the host busy as well, where the replicas fall
furthest behind.)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "daemon"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from chaoscluster import ChaosCluster  # noqa: E402
from harness import Lagwatch, Readings, cluster_config  # noqa: E402
from lagwatch.demo.binaries import find_binaries  # noqa: E402
from lagwatch.demo.ports import free_port  # noqa: E402
from loads import BusyHost, Oltp, ReplayBursts, big_update, create_heartbeat_table, prepare  # noqa: E402
from oracle import LagOracle, OracleLog, nearest_rank, tolerance  # noqa: E402

ARMS = {"lsn clock": {"lag_from_wal": "off"}, "wal": {}, "wal+heartbeat": {"heartbeat": {"interval": "10ms"}}}
INTERVALS = ("1s", "100ms")
BASE = "@base"  # an arm run from the --baseline build
BIG_ROWS = 1_000_000


def arm_config(cluster: ChaosCluster, interval: str, arm: str, span: float) -> dict[str, Any]:
    config = cluster_config(cluster, free_port(["127.0.0.1"]), interval=interval, window=f"{span:g}s")
    extra = dict(ARMS[arm.removesuffix(BASE)])
    if "heartbeat" in extra:
        extra["heartbeat"] = {**extra["heartbeat"], "id": f"bench-{interval}"}
    config["clusters"][0].update(extra)
    return config


def summary(readings: Readings, replica: str, log: OracleLog, start: float, end: float) -> str:
    seen = [r for r in readings.of(replica, start, end) if log.covers(replica, r.at)]
    if not seen:
        return "no readings"
    truths = [log.truth(replica, r.at) for r in seen]
    errors = sorted((r.seconds - t.mid) * 1000 for r, t in zip(seen, truths, strict=True))
    under = sum(1 for r, t in zip(seen, truths, strict=True) if t.low - r.seconds > tolerance(t.low, 0.010, 0.20))
    over = sum(1 for r, t in zip(seen, truths, strict=True) if r.seconds - t.high > tolerance(t.high, 0.005, 0.10))
    p95_read = nearest_rank([r.seconds for r in seen], 0.95) * 1000
    p95_true = nearest_rank([t.mid for t in truths], 0.95) * 1000
    # Which evidence the under-reads came from: where the estimator still errs low.
    low: dict[str, int] = {}
    for r, t in zip(seen, truths, strict=True):
        if t.low - r.seconds > tolerance(t.low, 0.010, 0.20):
            low[r.evidence] = low.get(r.evidence, 0) + 1
    by = " ".join(f"{e}:{n}" for e, n in sorted(low.items(), key=lambda kv: -kv[1]))
    return (f"n={len(seen):4d}  error median {statistics.median(errors):+7.1f}  p5 {nearest_rank(errors, 0.05):+7.1f}  "
            f"p95 {nearest_rank(errors, 0.95):+7.1f} ms  p95 {p95_read:6.1f} vs {p95_true:6.1f} ms  "
            f"under {100 * under / len(seen):5.1f}%  over {100 * over / len(seen):4.1f}%" + (f"  (under: {by})" if by
                                                                                            else ""))


def misreads(readings: Readings, replica: str, log: OracleLog, start: float, end: float) -> list[str]:
    """Each reading beyond the oracle's proven bounds, with what dated it: where to look."""
    lines = []
    for r in readings.of(replica, start, end):
        if not log.covers(replica, r.at):
            continue
        t = log.truth(replica, r.at)
        under = t.low - r.seconds > tolerance(t.low, 0.010, 0.20)
        over = r.seconds - t.high > tolerance(t.high, 0.005, 0.10)
        if under or over:
            lines.append(f"    {'under' if under else 'over '} at +{r.at - start:7.3f} s ({r.at:.3f}): "
                         f"read {1000 * r.seconds:7.1f} ms ({r.evidence}), "
                         f"truth {1000 * t.low:7.1f} .. {1000 * t.high:7.1f} ms, replay {r.replay_lsn}")
    return lines


def run_case(case: str, cluster: ChaosCluster, watchers: dict[tuple[str, str], Lagwatch], folder: Path,
             span: float, detail: bool = False) -> None:
    r1 = cluster.replicas[0]
    extra: Any = None
    r1.set_apply_delay(0.04 if case in ("steady", "busy") else 0)
    if case == "bursts":
        extra = ReplayBursts(r1, hold=0.04, run=0.03, seconds=span + 30)
    elif case in ("busy", "bigbusy"):
        extra = BusyHost(seconds=span + 30)
    folder.mkdir()
    with Oltp(cluster, folder) as oltp, LagOracle(cluster, folder / "oracle") as oracle:
        # Every 60 ms, as the field test reads: at 30 ms the reader was a load of its own.
        readings = {key: Readings(lw, every=0.06) for key, lw in watchers.items()}
        for r in readings.values():
            r.__enter__()
        try:
            if extra is not None:
                extra.__enter__()
            time.sleep(3.0)  # the case in force
            start = time.monotonic()
            if case in ("big", "bigbusy"):
                took: list[float] = []
                update = threading.Thread(target=lambda: took.append(big_update(cluster)))
                update.start()
                update.join()
                time.sleep(2.0)  # replayed through, caught up
                note = f"UPDATE of {BIG_ROWS} rows took {took[0]:.1f} s"
            else:
                time.sleep(span)
                note = ""
            end = time.monotonic()
            time.sleep(1.2)  # the last readings published
        finally:
            if extra is not None:
                extra.__exit__(None, None, None)
            for r in readings.values():
                r.__exit__(None, None, None)
        log = oracle.read(others=True)  # pgbench commits beside the writer
        tps = oltp.progress()
    r1.set_apply_delay(0)
    print(f"\n## {case}: pgbench {statistics.mean(tps) if tps else 0:.0f} tps {note}")
    for (interval, arm), r in readings.items():
        reads = {k: watchers[(interval, arm)].value(f"lagwatch_wal_dating_{k}_total", cluster="main") or 0
                 for k in ("reads", "reads_cancelled", "reads_failed", "reads_retried")}
        if reads["reads"]:
            print(f"{interval:>6} {arm:<14} WAL reads since start {reads['reads']:.0f}: cancelled at their budget "
                  f"{reads['reads_cancelled']:.0f}, failed {reads['reads_failed']:.0f}, run again without a range "
                  f"holding no whole record {reads['reads_retried']:.0f}")
        for replica in ("replica1", "replica2"):
            print(f"{interval:>6} {arm:<14} {replica}: {summary(r, replica, log, start, end)}")
            if detail:
                print("\n".join(misreads(r, replica, log, start, end)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg-major", type=int, default=None)
    parser.add_argument("--span", type=float, default=10.0)
    parser.add_argument("--cases", default="steady,big,bursts,busy")
    parser.add_argument("--arms", default=",".join(ARMS), help="of: " + ", ".join(ARMS))
    parser.add_argument("--intervals", default=",".join(INTERVALS))
    parser.add_argument("--detail", action="store_true", help="print every reading beyond the oracle's bounds")
    parser.add_argument("--baseline", type=Path, default=None, help="another build's checkout, run beside")
    args = parser.parse_args()
    binaries = find_binaries(args.pg_major)
    with ChaosCluster(binaries, replicas=2) as cluster, tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        create_heartbeat_table(cluster)
        prepare(cluster, big_rows=BIG_ROWS if "big" in args.cases else 0)
        watchers = {}
        try:
            for interval in args.intervals.split(","):
                for arm in args.arms.split(","):
                    for build in ("", BASE) if args.baseline is not None else ("",):
                        name = arm + build
                        work = folder / f"lw-{interval}-{name.replace('+', '-').replace(' ', '-').replace('@', '')}"
                        work.mkdir()
                        env = {"PYTHONPATH": str(args.baseline.resolve() / "daemon")} if build else None
                        watchers[(interval, name)] = Lagwatch(work, arm_config(cluster, interval, name, args.span),
                                                              env=env)
            for lw in watchers.values():
                lw.wait_ready()
            print(f"PostgreSQL {binaries.major}, primary + 2 streaming replicas on loopback; "
                  f"error = reading - the middle of the oracle's interval")
            for case in args.cases.split(","):
                run_case(case, cluster, watchers, folder / case, args.span, args.detail)
        finally:
            for lw in watchers.values():
                lw.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
