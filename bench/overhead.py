"""Benchmark: what watching costs the primary, at no lagwatch, at 1 s and at 100 ms.

Starts a real primary with two streaming replicas, then runs pgbench (TPC-B-like, writes)
against the primary once per arm: no lagwatch, `lagwatch run` at `interval: 1s` and at
`interval: 100ms` without staleness dated from the WAL (`lag_from_wal: off`), and the same
two with it (`+wal`: pg_walinspect reads the commits past each replica's replay position
every cycle while the replicas lag at all, as they do under this load), and with the
heartbeat too (`+hb`, every 25 ms, its default). The arms run in rotated order, each arm
once per round, so drift on a shared machine falls on every arm alike, and the spread of
the "none" arm across rounds is the A/A noise band that the other arms are read against.

Per arm it prints: the primary's throughput (tps) and latency (mean, p95, p99 from
pgbench's per-transaction log), lagwatch's CPU (% of one core), each server's CPU spent
in lagwatch's own backends, and lagwatch's cycle time. It prints; it asserts nothing.

    python3 bench/overhead.py [--rounds 7] [--seconds 20] [--clients 4] [--pg-major 15]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "daemon"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from harness import Lagwatch, cluster_config  # noqa: E402
from lagwatch.demo.binaries import find_binaries  # noqa: E402
from lagwatch.demo.cluster import LocalCluster  # noqa: E402
from lagwatch.demo.ports import free_port  # noqa: E402
from lagwatch.demo.servers import LocalServer  # noqa: E402
from loads import create_heartbeat_table  # noqa: E402

ARMS = ("none", "1s", "1s+wal", "1s+wal+hb", "100ms", "100ms+wal", "100ms+wal+hb")
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class ArmResult:
    tps: list[float] = field(default_factory=list)
    latency_ms: list[list[float]] = field(default_factory=list)  # per round: every transaction
    lagwatch_cpu: list[float] = field(default_factory=list)  # % of one core
    backend_cpu: dict[str, list[float]] = field(default_factory=dict)  # server -> % of one core
    cycle_ms: list[float] = field(default_factory=list)


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, in seconds (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def lagwatch_backends(server: LocalServer) -> list[int]:
    rows = server.execute("SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'lagwatch/%'")
    return [int(pid) for (pid,) in rows]


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or "?")
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({model}), {mem_gb:.0f} GiB, {platform.system()} {platform.release()}"


def run_pgbench(cluster: LocalCluster, seconds: float, clients: int, folder: Path) -> tuple[float, list[float]]:
    for old in folder.glob("pgbench_log.*"):
        old.unlink()
    pgbench = str(cluster.binaries.tool("pgbench"))
    out = subprocess.run([pgbench, "-h", cluster.primary.host, "-p", str(cluster.primary.port), "-U", "postgres",
                          "-n", "-c", str(clients), "-j", "2", "-T", str(int(seconds)), "-l",
                          "--log-prefix", str(folder / "pgbench_log"), "postgres"],
                         capture_output=True, text=True, check=True, cwd=folder)
    tps = next(float(line.split("=")[1].split()[0]) for line in out.stdout.splitlines() if line.startswith("tps ="))
    latencies = []
    for log in folder.glob("pgbench_log.*"):
        for line in log.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3:
                latencies.append(int(parts[2]) / 1000.0)  # microseconds -> ms
    return tps, latencies


def reset(cluster: LocalCluster) -> None:
    """Every arm starts from the same state: without this, pgbench_history's growth and
    dead tuples make each arm slower than the one before, whatever it measures."""
    cluster.primary.execute("TRUNCATE pgbench_history")
    cluster.primary.execute("VACUUM ANALYZE pgbench_accounts, pgbench_branches, pgbench_tellers")
    cluster.primary.execute("CHECKPOINT")
    cluster.wait_replayed()


def run_arm(arm: str, cluster: LocalCluster, args: argparse.Namespace, folder: Path, result: ArmResult) -> None:
    reset(cluster)
    lw = None
    if arm != "none":
        work = folder / f"lagwatch-{arm}-{len(result.tps)}"
        work.mkdir()
        interval, *extras = arm.split("+")
        config = cluster_config(cluster, free_port(["127.0.0.1"]), interval=interval, window="5m")
        config["clusters"][0]["lag_from_wal"] = "auto" if "wal" in extras else "off"
        if "hb" in extras:
            config["clusters"][0]["heartbeat"] = {"interval": "25ms", "id": f"bench-{arm.replace('+', '-')}"}
        lw = Lagwatch(work, config)
        lw.wait_ready()
        time.sleep(2.0)  # connections made, first cycles done
    servers = {s.name: s for s in cluster.servers}
    backends = {name: lagwatch_backends(s) for name, s in servers.items()} if lw else {}
    before_backends = {name: sum(cpu_seconds(p) for p in pids) for name, pids in backends.items()}
    before_lw = cpu_seconds(lw.proc.pid) if lw else 0.0
    sampling = threading.Event()
    sampler = threading.Thread(target=_sample_cycles, args=(lw, sampling, result.cycle_ms), daemon=True)
    if lw is not None:
        sampler.start()
    started = time.monotonic()
    tps, latencies = run_pgbench(cluster, args.seconds, args.clients, folder)
    elapsed = time.monotonic() - started
    sampling.set()
    result.tps.append(tps)
    result.latency_ms.append(latencies)
    if lw is not None:
        result.lagwatch_cpu.append(100 * (cpu_seconds(lw.proc.pid) - before_lw) / elapsed)
        for name, pids in backends.items():
            used = sum(cpu_seconds(p) for p in pids) - before_backends[name]
            result.backend_cpu.setdefault(name, []).append(100 * used / elapsed)
        sampler.join()
        lw.stop()


def _sample_cycles(lw: Lagwatch | None, stop: threading.Event, out: list[float]) -> None:
    """The last cycle's duration, scraped once a second as Prometheus would (a denser
    sampler would itself cost lagwatch CPU and skew the figure it measures)."""
    assert lw is not None
    while not stop.wait(1.0):
        for line in lw.get("/metrics")[1].splitlines():
            if line.startswith("lagwatch_cycle_duration_seconds "):
                out.append(float(line.split()[1]) * 1000)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="a multiple of 7 puts every arm in every slot")
    parser.add_argument("--seconds", type=float, default=20.0, help="pgbench duration per arm")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--pg-major", type=int, default=None)
    args = parser.parse_args()

    binaries = find_binaries(args.pg_major)
    results = {arm: ArmResult() for arm in ARMS}
    with LocalCluster(binaries, replicas=2) as cluster, tempfile.TemporaryDirectory() as tmp:
        cluster.start()
        folder = Path(tmp)
        subprocess.run([str(binaries.tool("pgbench")), "-i", "-q", "-s", str(args.scale), "-h", cluster.primary.host,
                        "-p", str(cluster.primary.port), "-U", "postgres", "postgres"],
                       check=True, capture_output=True)
        create_heartbeat_table(cluster)  # type: ignore[arg-type]
        cluster.wait_replayed()
        for round_no in range(args.rounds):
            order = ARMS[round_no % len(ARMS):] + ARMS[:round_no % len(ARMS)]
            for arm in order:
                print(f"round {round_no + 1}/{args.rounds}: {arm} ...", file=sys.stderr, flush=True)
                run_arm(arm, cluster, args, folder, results[arm])

    print(f"machine: {machine()}; PostgreSQL {binaries.major}, primary + 2 streaming replicas on loopback")
    print(f"load: pgbench TPC-B-like, {args.clients} clients, scale {args.scale}, {args.seconds:g} s per arm, "
          f"{args.rounds} rounds, arms in rotated order")
    none_tps = results["none"].tps
    band = (max(none_tps) - min(none_tps)) / statistics.mean(none_tps) * 100
    print(f"A/A noise band (spread of the 'none' arm across rounds): {band:.1f}% of its mean tps")
    for arm in ARMS[1:]:
        paired = [(t / n - 1) * 100 for t, n in zip(results[arm].tps, none_tps, strict=True)]
        print(f"{arm} vs none in the same round: {statistics.mean(paired):+.1f}% mean, "
              f"{min(paired):+.1f}% .. {max(paired):+.1f}%")
    print()
    header = ("arm", "tps (mean of rounds)", "vs none", "latency mean / p95 / p99 ms", "lagwatch CPU",
              "backend CPU primary / r1 / r2", "cycle ms (median / max)")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    base = statistics.mean(none_tps)
    for arm in ARMS:
        r = results[arm]
        lat = [v for run in r.latency_ms for v in run]
        tps = statistics.mean(r.tps)
        backend = " / ".join(f"{statistics.mean(r.backend_cpu[s]):.2f}%" for s in ("primary", "replica1", "replica2")
                             if s in r.backend_cpu) or "-"
        cycle = f"{statistics.median(r.cycle_ms):.1f} / {max(r.cycle_ms):.1f}" if r.cycle_ms else "-"
        lw_cpu = f"{statistics.mean(r.lagwatch_cpu):.1f}%" if r.lagwatch_cpu else "-"
        print(f"| {arm} | {tps:.0f} ({', '.join(f'{t:.0f}' for t in r.tps)}) | {(tps / base - 1) * 100:+.1f}% | "
              f"{statistics.mean(lat):.2f} / {pct(lat, 0.95):.2f} / {pct(lat, 0.99):.2f} | {lw_cpu} | {backend} | "
              f"{cycle} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
