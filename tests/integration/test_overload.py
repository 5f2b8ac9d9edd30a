"""A monitor in trouble never acts: a fleet under pool control on a host starved of CPU.

101 clusters of 3 nodes on four real servers (a primary and three streaming replicas), every
cluster under pool control through a ``command`` pooler: 100 clusters on the primary,
replica1 and replica2, and one, ``x``, whose second replica is replica3, a server of its own.
CPU-bound processes (three per core, each ending by itself) starve lagwatch for 30 s, and
meanwhile replica3 is stopped. What must hold:

- no pool change for the healthy clusters (``lagwatch_pool_changes_total`` flat, no ``pool
  change`` line), no healthy node ever read down (``lagwatch_up`` sampled, no ``down:`` line),
  no role change, no "no node accepts writes", no session remade (``lagwatch_connects_total``
  flat), and every cycle within 2 intervals once the load stops;
- the real failure still acts: ``x``'s replica3 is ejected within ``eject_after`` cycles of
  the effective interval once the load stops (or before), and it is the only pool change;
- lagwatch restarted on that fleet reads no node down, logs no per-node WARNING while
  connecting, and has every node up and every cluster's leadership settled within 10 s.

What is tested does not depend on the PostgreSQL version: one runs these.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from chaoscluster import ChaosCluster
from harness import Lagwatch, Writer, let_time_pass
from lagwatch.demo.binaries import find_binaries
from lagwatch.demo.ports import free_port

pytestmark = pytest.mark.one_pg_version

CLUSTERS = 100
NODES = ("primary", "replica1", "replica2")
STARVE_SECONDS = 30.0
EJECT_AFTER = 3
SLA = {"max_lag": "10s", "eject_after": EJECT_AFTER, "readmit_after": 5, "min_replicas": 1}
HOGS_PER_CORE = 3


class OverloadServers(ChaosCluster):
    """Room for two daemons' sessions to 101 clusters (a restart overlaps briefly) and the tests' own."""

    def primary_settings(self) -> dict[str, str]:
        return {**super().primary_settings(), "max_connections": "500"}


@pytest.fixture(scope="module")
def servers(pg_major: int) -> Iterator[OverloadServers]:
    with OverloadServers(find_binaries(pg_major), replicas=3) as cluster:
        yield cluster


def fleet_config(servers: ChaosCluster, workdir: Path) -> dict[str, Any]:
    pools = workdir / "pools"
    pools.mkdir(exist_ok=True)
    primary, replica1, replica2, replica3 = servers.primary, *servers.replicas

    def cluster(name: str, replicas: list[Any]) -> dict[str, Any]:
        return {"name": name, "primary": {"dsn": primary.dsn()},
                "replicas": [{"name": r.name, "dsn": r.dsn()} for r in replicas], "sla": SLA,
                "pooler": {"kind": "command", "template": "{members}\n", "output_file": str(pools / f"{name}.txt"),
                           "reload_command": ["true"]}}

    return {"interval": "1s", "window": "1m", "listen": f"127.0.0.1:{free_port(['127.0.0.1'])}",
            "state_dir": str(workdir / "state"),
            "clusters": [cluster(f"c{i:03d}", [replica1, replica2]) for i in range(CLUSTERS)]
            + [cluster("x", [replica1, replica3])]}


HEALTHY = {(f"c{i:03d}", n) for i in range(CLUSTERS) for n in NODES} | {("x", "primary"), ("x", "replica1")}
ALL_NODES = HEALTHY | {("x", "replica3")}
SAMPLE = re.compile(r'^(lagwatch_up|lagwatch_leader|lagwatch_connects_total|lagwatch_pool_changes_total)'
                    r'\{([^}]*)\} (\S+)$|^(lagwatch_cycles_total|lagwatch_last_poll_timestamp_seconds|'
                    r'lagwatch_cycle_duration_seconds|lagwatch_effective_interval_seconds) (\S+)$', re.M)
LABEL = re.compile(r'(\w+)="([^"]*)"')


@dataclass
class Reading:
    """One scrape, read by hand (the parser of a 100-cluster /metrics costs the starved test too much)."""

    at: float
    up: dict[tuple[str, str], float] = field(default_factory=dict)
    leader: dict[str, float] = field(default_factory=dict)
    connects: dict[tuple[str, str], float] = field(default_factory=dict)
    changes: dict[tuple[str, str, str], float] = field(default_factory=dict)
    daemon: dict[str, float] = field(default_factory=dict)


def read(lw: Lagwatch) -> Reading | None:
    try:
        with urllib.request.urlopen(lw.url("/metrics"), timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    out = Reading(time.monotonic())
    for m in SAMPLE.finditer(text):
        if m.group(4):
            out.daemon[m.group(4)] = float(m.group(5))
            continue
        labels = dict(LABEL.findall(m.group(2)))
        value = float(m.group(3))
        if m.group(1) == "lagwatch_up":
            out.up[(labels["cluster"], labels["node"])] = value
        elif m.group(1) == "lagwatch_leader":
            out.leader[labels["cluster"]] = value
        elif m.group(1) == "lagwatch_connects_total":
            out.connects[(labels["cluster"], labels["node"])] = value
        else:
            out.changes[(labels["cluster"], labels["replica"], labels["action"])] = value
    return out


def converged(r: Reading | None, nodes: set[tuple[str, str]]) -> bool:
    return (r is not None and {k for k, v in r.up.items() if v == 1} >= nodes
            and len(r.leader) == CLUSTERS + 1 and all(v == 1 for v in r.leader.values()))


class Sampler:
    """Scrapes /metrics every ``every`` seconds in a thread, keeping every reading."""

    def __init__(self, lw: Lagwatch, every: float = 0.25) -> None:
        self.lw, self.every, self.readings = lw, every, []  # type: ignore[var-annotated]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            r = read(self.lw)
            if r is not None:
                self.readings.append(r)
            self._stop.wait(self.every)

    def stop(self) -> list[Reading]:
        self._stop.set()
        self._thread.join(10)
        return list(self.readings)


class Hogs:
    """CPU-bound processes, HOGS_PER_CORE per core of ``cpus``, pinned to them, each ending
    by itself after ``seconds``."""

    def __init__(self, seconds: float, cpus: set[int]) -> None:
        code = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
        self.procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(HOGS_PER_CORE * len(cpus))]
        for p in self.procs:
            os.sched_setaffinity(p.pid, cpus)

    def wait(self) -> float:
        for p in self.procs:
            p.wait(120)
        return time.monotonic()

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def pause(lw: Lagwatch, seconds: float) -> None:
    """Stop lagwatch for ``seconds`` (a VM's steal, a stop-the-world pause): the length of
    the pause is the point, so it is a sleep."""
    lw.proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        lw.proc.send_signal(signal.SIGCONT)


def lines(log: str, text: str) -> list[str]:
    return [line for line in log.splitlines() if text in line]


def test_a_starved_lagwatch_never_acts_and_a_real_failure_still_does(servers: OverloadServers,
                                                                       tmp_path: Path) -> None:
    config = fleet_config(servers, tmp_path)
    replica3 = servers.replicas[2]
    lw = Lagwatch(tmp_path, config, log_level="info")
    hogs: Hogs | None = None
    sampler: Sampler | None = None
    try:
        with Writer(servers, every=0.2, max_seconds=600):
            lw.wait_ready(60)
            lw.wait_for("every node up and every cluster led", lambda: converged(read(lw), ALL_NODES), 60)
            lw.wait_cycles(3)  # a few cycles in the steady state
            before = read(lw)
            assert before is not None and not any(before.changes.values()), before.changes
            pools = {p.name: p.read_text() for p in (tmp_path / "pools").glob("*.txt")}
            log_before = len(lw.log_text())

            sampler = Sampler(lw)
            # lagwatch and the neighbours share one core (the servers keep the rest): a
            # 2-core host where the neighbours are busy on both, at half the cost to the test.
            core = {min(os.sched_getaffinity(0))}
            os.sched_setaffinity(lw.proc.pid, core)
            hogs = Hogs(STARVE_SECONDS, core)
            let_time_pass(8)  # 8 s starved: the host's load is time, not a state to wait for
            pause(lw, 2.0)  # and a pause (a VM's steal, a stop the world): lagwatch late for 2 s at once
            replica3.stop("fast")  # a real failure, in the middle of the starvation
            stopped_at = time.monotonic()
            let_time_pass(8)  # 8 s more starved, with replica3 really down
            pause(lw, 2.0)
            load_stopped_at = hogs.wait()
            os.sched_setaffinity(lw.proc.pid, os.sched_getaffinity(0))
            effective = (read(lw) or before).daemon["lagwatch_effective_interval_seconds"]
            # Ejected within eject_after cycles of the effective interval once the load stopped (if not before).
            deadline = max(stopped_at, load_stopped_at) + (EJECT_AFTER + 1) * effective + 2.0
            lw.wait_for("x/replica3 ejected", lambda: (read(lw) or before).changes.get(
                ("x", "replica3", "eject")) == 1, max(1.0, deadline - time.monotonic()))
            lw.wait_cycles(10)  # cycles after the load: their durations and spacing are checked
            readings = sampler.stop()
        log = lw.log_text()[log_before:]
        after = readings[-1]

        # The real failure acted, and it is the only pool change, decided or logged.
        assert {k: v for k, v in after.changes.items() if v} == {("x", "replica3", "eject"): 1.0}
        changes = lines(log, "pool change")
        assert len(changes) == 1 and "cluster=x replica=replica3 action=eject" in changes[0], changes
        assert {p.name: p.read_text() for p in (tmp_path / "pools").glob("*.txt") if p.name != "x.txt"} == \
            {k: v for k, v in pools.items() if k != "x.txt"}
        # No healthy node ever read down, in any reading or line.
        down = sorted({(node, r.at) for r in readings for node, v in r.up.items() if v == 0 and node in HEALTHY})
        assert not down, down[:10]
        assert [line for line in lines(log, ": down:") if "x/replica3" not in line] == []
        for text in ("role changed", "no node accepts writes", "the primary is now another server",
                     "no longer the leader"):
            assert lines(log, text) == [], text
        # No session was remade.
        assert {k: v for k, v in after.connects.items() if k in HEALTHY} == \
            {k: v for k, v in before.connects.items() if k in HEALTHY}
        # Once the load stopped, every cycle within 2 intervals: durations and spacing.
        later = [r for r in readings if r.at >= load_stopped_at + 1.0]
        assert len(later) >= 20
        assert max(r.daemon["lagwatch_cycle_duration_seconds"] for r in later) <= 2.0
        published = sorted({(r.daemon["lagwatch_cycles_total"], r.daemon["lagwatch_last_poll_timestamp_seconds"])
                            for r in later})
        gaps = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in itertools.pairwise(published) if b[0] > a[0]]
        assert gaps and max(gaps) <= 2.0, gaps
        cycles = [r.daemon["lagwatch_cycle_duration_seconds"] for r in readings if r.at < load_stopped_at]
        loop_lag = lines(log, "cycles do not fit")
        print(f"starved: cycles up to {max(cycles):.2f}s while starved; effective interval {effective}s at the "
              f"end; x/replica3 ejected; {len(loop_lag)} overload line(s); late answers "
              f"{after.daemon.get('lagwatch_late_answers_total', 0)}")

        # Restart on the same fleet (replica3 back): nothing read down while connecting, converged in 10 s.
        replica3.start()
        servers.wait_streaming(60)
        assert lw.stop() == 0
        lw2_dir = tmp_path / "restarted"
        lw2_dir.mkdir()
        started = time.monotonic()
        with Lagwatch(lw2_dir, {**config, "listen": f"127.0.0.1:{free_port(['127.0.0.1'])}"}, log_level="info") as lw2:
            seen: list[Reading] = []
            while time.monotonic() - started < 20:
                r = read(lw2)
                if r is not None:
                    seen.append(r)
                    if converged(r, ALL_NODES):
                        break
                time.sleep(0.1)
            took = seen[-1].at - started if seen and converged(seen[-1], ALL_NODES) else float("inf")
            assert all(v == 1 for r in seen for v in r.up.values()), "a node read down while connecting"
            log2 = lw2.log_text()
            per_node = [line for line in log2.splitlines() if " WARNING " in line
                        and re.search(r"\b(c\d{3}|x)(/\w+)?: ", line)]
            assert per_node == [], per_node[:5]
            print(f"restart: converged {took:.2f}s after start")
            assert took <= 10.0
    finally:
        if sampler is not None:
            sampler.stop()
        if hogs is not None:
            hogs.kill()
        lw.stop()
        if not replica3.is_running():
            replica3.start()
