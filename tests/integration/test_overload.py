"""A monitor in trouble never acts: a fleet under pool control on a host starved of CPU.

101 clusters of 3 nodes on four real servers (a primary and three streaming replicas), every
cluster under pool control through a ``command`` pooler: 100 clusters on the primary,
replica1 and replica2, and one, ``x``, whose second replica is replica3, a server of its own.
CPU-bound processes (three per core) starve lagwatch for about 25 s, with two 2 s pauses
(SIGSTOP), and meanwhile replica3 is stopped. What must hold:

- no pool change for the healthy clusters (``lagwatch_pool_changes_total`` flat, no ``pool
  change`` line), no healthy node ever read down (``lagwatch_up`` sampled, no ``down:`` line),
  no role change, no "no node accepts writes", no session remade (``lagwatch_connects_total``
  flat);
- once the load stops, lagwatch's pace forgets it within the pacer's memory of cycles: from
  the first cycle that remembers only cycles begun after the load, every interval it keeps
  (``lagwatch_effective_interval_seconds``) is at most what those cycles' own durations (its
  log's) call for: the configured interval when they fit it, as on a quiet host, a
  stretch no longer than they need on a host busy of its own;
- the real failure still acts: ``x``'s replica3 is ejected within ``eject_after`` cycles
  lagwatch was on time for after the cycle under way when the load stopped (or before),
  and it is the only pool change;
- lagwatch restarted on that fleet reads no node down, logs no per-node WARNING while
  connecting, and has every node up and every cluster's leadership settled within
  ``CONVERGE_CYCLES`` of its own cycles.

Every timing here is counted in the cycles lagwatch published (``lagwatch_cycles_total``,
and its log's one line per cycle for a fleet), never in the test's clock: the clock only
makes the load (its length is the point) and bounds a wait that would otherwise hang.

What is tested does not depend on the PostgreSQL version: one runs these.
"""

from __future__ import annotations

import itertools
import math
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
from lagwatch.durations import parse_duration
from lagwatch.estimate.lateness import HEADROOM, MAX_STRETCH, PACE_CYCLES, PACE_STEP
from lagwatch.read.session import CONNECTS_AT_ONCE

pytestmark = pytest.mark.one_pg_version

CLUSTERS = 100
NODES = ("primary", "replica1", "replica2")
# The load, in seconds of the clock (its length is the point): starved before replica3
# stops and after, each stretch ended by a pause, then starved a little more after the
# second pause, so that lagwatch comes back from it still starved.
STARVED = 8.0
PAUSED = 2.0
STARVED_AFTER_PAUSE = 3.0
HOGS_AT_MOST = 60.0  # the neighbours end by themselves this long after they start, should the test not end them
EJECT_AFTER = 3
AFTER_EJECT = 10  # cycles watched after the eject for any other change
SLA = {"max_lag": "10s", "eject_after": EJECT_AFTER, "readmit_after": 5, "min_replicas": 1}
HOGS_PER_CORE = 3
# Cycles watched once the pacer remembers no starved cycle.
PACED_CYCLES = 5
# A restarted lagwatch's cycles until every node is up and every cluster led, from what it
# must do: make every session (each node's, and the leader-lock session on the one primary
# server) CONNECTS_AT_ONCE at a time, each within its connect timeout or it fails (and the
# node reads down, which must not happen here); ask each node its first poll, within the
# query timeout; take the locks on the lock session, whose outcome the cycle that ends
# after it takes, and that cycle's decisions read the clusters led. Both timeouts are 0.8
# of the 1 s interval (the config's defaults): ceil(304 / 32) = 10 turns at the gate take
# at most 8 intervals, the first poll 0.8 more, and the cycle that takes them ends within
# one more: 10 cycles. (The 2-core test machine took 2-3, busy or not; counted in cycles,
# the seconds a busy host spends starting Python before the first one do not count.)
SESSIONS = 3 * (CLUSTERS + 1) + 1
TIMEOUT_INTERVALS = 0.8
CONVERGE_CYCLES = math.ceil(math.ceil(SESSIONS / CONNECTS_AT_ONCE) * TIMEOUT_INTERVALS + TIMEOUT_INTERVALS) + 1


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
                    r'\{([^}]*)\} (\S+)$|^(lagwatch_cycles_total|lagwatch_cycle_overruns_total|'
                    r'lagwatch_late_answers_total|lagwatch_cycle_duration_seconds|lagwatch_interval_seconds|'
                    r'lagwatch_effective_interval_seconds|lagwatch_loop_lag_seconds) (\S+)$', re.M)
LABEL = re.compile(r'(\w+)="([^"]*)"')
# A fleet's one INFO line per cycle (cyclelog.fleet_line), written as the cycle is
# published, with how long it took (durations.format_duration: whole ms below a second).
CYCLE_LINE = re.compile(r" INFO lagwatch\.daemon: \d+ clusters, \d+ replicas in ([^;]+)")


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


def read_now(lw: Lagwatch) -> Reading:
    """A scrape now: a few tries, should one fail."""
    for _ in range(10):
        r = read(lw)
        if r is not None:
            return r
        time.sleep(0.1)
    raise AssertionError("lagwatch does not answer /metrics")


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
    """CPU-bound processes, HOGS_PER_CORE per core of ``cpus``, pinned to them, until
    ``kill`` (each ends by itself after ``seconds``, should nobody end it)."""

    def __init__(self, seconds: float, cpus: set[int]) -> None:
        code = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
        self.procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(HOGS_PER_CORE * len(cpus))]
        for p in self.procs:
            os.sched_setaffinity(p.pid, cpus)

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


class CycleLog:
    """lagwatch's own account of its cycles, from its log: a fleet logs one line per cycle
    (with its duration) once more than five of its clusters are published, and logs what
    a cycle decides (a pool change, the pace) before that cycle's line. Numbered as
    ``lagwatch_cycles_total`` counts: ``unlogged`` cycles at the start logged no such line."""

    def __init__(self, log: str, unlogged: int) -> None:
        self.lines = log.splitlines()
        self.unlogged = unlogged

    @property
    def cycles(self) -> int:
        return self.unlogged + sum(1 for line in self.lines if CYCLE_LINE.search(line))

    def cycles_of(self, text: str) -> list[int]:
        """The cycle that logged each line with ``text``."""
        out, done = [], self.unlogged
        for line in self.lines:
            if CYCLE_LINE.search(line):
                done += 1
            elif text in line:
                out.append(done + 1)
        return out

    def durations(self) -> dict[int, float]:
        """Each logged cycle's duration, by cycle."""
        out, done = {}, self.unlogged
        for line in self.lines:
            if m := CYCLE_LINE.search(line):
                done += 1
                out[done] = parse_duration(m.group(1))
        return out


def unlogged_cycles(lw: Lagwatch) -> int:
    """The cycles at the start that logged no cycle line: ``lagwatch_cycles_total`` less
    the lines, both read between two cycles (the log read before and after the scrape agree)."""
    for _ in range(50):
        logged = CycleLog(lw.log_text(), 0).cycles
        r = read(lw)
        if r is not None and CycleLog(lw.log_text(), 0).cycles == logged:
            return int(r.daemon["lagwatch_cycles_total"]) - logged
    raise AssertionError("no scrape between two cycles in 50 tries")


def late_cycles(readings: list[Reading], after: int, upto: int) -> int:
    """At most how many of the cycles after ``after`` up to ``upto`` got some answer too
    late to count (lagwatch_late_answers_total grew): every cycle between two readings
    that saw it grow is counted, as the readings cannot tell which of them it was."""
    late: set[int] = set()
    for a, b in itertools.pairwise(readings):
        if b.daemon["lagwatch_late_answers_total"] > a.daemon["lagwatch_late_answers_total"]:
            late.update(range(int(a.daemon["lagwatch_cycles_total"]) + 1, int(b.daemon["lagwatch_cycles_total"]) + 1))
    return len({c for c in late if after < c <= upto})


def pace_needed(durations: dict[int, float], cycle: int, interval: float) -> float:
    """The most lateness.Pacer may keep after ``cycle`` from the cycles it remembers (the
    last PACE_CYCLES): the longest with its headroom, in whole tenths of the interval up,
    never below the interval (it keeps less when a cycle fits and lagwatch was on time in
    it, or the change is under a tenth). A logged duration is rounded to the millisecond:
    each is taken at the most it may have been."""
    longest = max(durations[c] for c in range(cycle - PACE_CYCLES + 1, cycle + 1)) + 0.0005
    step = PACE_STEP * interval
    return min(max(interval, math.ceil(longest * HEADROOM / step) * step), MAX_STRETCH * interval)


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
            interval = before.daemon["lagwatch_interval_seconds"]
            unlogged = unlogged_cycles(lw)
            log_before = len(lw.log_text())

            sampler = Sampler(lw)
            # lagwatch and the neighbours share one core (the servers keep the rest): a
            # 2-core host where the neighbours are busy on both, at half the cost to the test.
            core = {min(os.sched_getaffinity(0))}
            os.sched_setaffinity(lw.proc.pid, core)
            hogs = Hogs(HOGS_AT_MOST, core)
            let_time_pass(STARVED)  # starved: the host's load is time, not a state to wait for
            pause(lw, PAUSED)  # and a pause (a VM's steal, a stop the world): lagwatch late for 2 s at once
            replica3.stop("fast")  # a real failure, in the middle of the starvation
            let_time_pass(STARVED)  # starved more, with replica3 really down
            pause(lw, PAUSED)
            let_time_pass(STARVED_AFTER_PAUSE)  # back from the pause, still starved
            hogs.kill()
            os.sched_setaffinity(lw.proc.pid, os.sched_getaffinity(0))
            # Cycles published by the time the load stopped (or just after: the count errs
            # towards fewer cycles after the load, never more). The one under way then,
            # load_stop + 1, began starved. (Its log line may lag its publication.)
            load_stop = int(read_now(lw).daemon["lagwatch_cycles_total"])

            # The first cycle whose pace remembers only cycles begun after the load stopped.
            forgotten = load_stop + 1 + PACE_CYCLES

            # Wait for the real failure to act, then for AFTER_EJECT cycles more and
            # PACED_CYCLES from that one: how many cycles the eject took is judged below; the
            # clock only keeps a broken run from hanging (cycles of up to MAX_STRETCH intervals).
            ejected_seen: list[float] = []

            def settled() -> bool:
                r = read(lw)
                if r is None:
                    return False
                cycles = r.daemon["lagwatch_cycles_total"]
                if not ejected_seen and r.changes.get(("x", "replica3", "eject")) == 1:
                    ejected_seen.append(cycles)
                return bool(ejected_seen) and cycles >= max(ejected_seen[0] + AFTER_EJECT,
                                                            forgotten + PACED_CYCLES - 1)

            lw.wait_for("x/replica3 ejected and the cycles after it and the load", settled, 300)
            readings = sampler.stop()
        cycle_log = CycleLog(lw.log_text(), unlogged)
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

        # Ejected within eject_after cycles once the load stopped (if not before): the cycle
        # under way then began starved and may be no evidence; each later one is, unless
        # lagwatch got some answer too late in it (x's may have been one: then x decided
        # nothing that cycle, as a monitor in trouble must).
        (ejected,) = cycle_log.cycles_of("cluster=x replica=replica3 action=eject")
        late = late_cycles(readings, load_stop + 1, ejected)
        assert ejected <= load_stop + 1 + EJECT_AFTER + late, (ejected, load_stop, late)
        # The pacer forgets the starvation within its memory: from the first cycle that
        # remembers only cycles begun after the load, the interval kept is at most what
        # those cycles call for (on a quiet host the configured one), in every reading.
        durations = cycle_log.durations()
        paced = [(int(r.daemon["lagwatch_cycles_total"]), r.daemon["lagwatch_effective_interval_seconds"])
                 for r in readings if r.daemon["lagwatch_cycles_total"] >= forgotten]
        assert paced, "no reading after the pacer's memory"
        held = [(c, kept, pace_needed(durations, c, interval)) for c, kept in sorted(set(paced))]
        assert all(kept <= needed + 1e-9 for _, kept, needed in held), \
            (held, [(c, durations[c]) for c in sorted(durations) if c > load_stop])
        starved = [r for r in readings if r.daemon["lagwatch_cycles_total"] <= load_stop + 1]
        print(f"starved: cycles up to {max(r.daemon['lagwatch_cycle_duration_seconds'] for r in starved):.2f}s, "
              f"interval kept up to {max(r.daemon['lagwatch_effective_interval_seconds'] for r in starved):.1f}s, "
              f"{len(lines(log, 'cycles do not fit'))} overload line(s); the load stopped in cycle {load_stop + 1}; "
              f"x/replica3 ejected in cycle {ejected} ({late} late); from cycle {forgotten} (cycle, interval "
              f"kept, at most): {[(c, round(kept, 1), round(needed, 1)) for c, kept, needed in held]}; "
              f"durations from cycle {load_stop + 1}: {[durations[c] for c in sorted(durations) if c > load_stop]}; "
              f"{after.daemon['lagwatch_late_answers_total']:.0f} late answers and "
              f"{after.daemon['lagwatch_cycle_overruns_total']:.0f} overruns in all")

        # Restart on the same fleet (replica3 back): nothing read down while connecting,
        # converged within CONVERGE_CYCLES of its own cycles.
        replica3.start()
        servers.wait_streaming(60)
        assert lw.stop() == 0
        lw2_dir = tmp_path / "restarted"
        lw2_dir.mkdir()
        started = time.monotonic()
        with Lagwatch(lw2_dir, {**config, "listen": f"127.0.0.1:{free_port(['127.0.0.1'])}"}, log_level="info") as lw2:
            seen: list[Reading] = []

            def convergence() -> bool:
                r = read(lw2)
                if r is not None:
                    seen.append(r)
                return converged(r, ALL_NODES)

            # The clock only keeps a broken run from hanging; the bound is in cycles, below.
            lw2.wait_for("every node up and every cluster led after the restart", convergence, 120)
            took = seen[-1].daemon["lagwatch_cycles_total"]
            assert all(v == 1 for r in seen for v in r.up.values()), "a node read down while connecting"
            log2 = lw2.log_text()
            per_node = [line for line in log2.splitlines() if " WARNING " in line
                        and re.search(r"\b(c\d{3}|x)(/\w+)?: ", line)]
            assert per_node == [], per_node[:5]
            steps = sorted({(int(r.daemon.get("lagwatch_cycles_total", 0)), int(sum(r.up.values())),
                             int(sum(r.leader.values()))) for r in seen})
            print(f"restart: converged in cycle {took:.0f}, {seen[-1].at - started:.2f}s after start; "
                  f"(cycle, nodes up, clusters led): {steps}")
            assert took <= CONVERGE_CYCLES, took
    finally:
        if sampler is not None:
            sampler.stop()
        if hogs is not None:
            hogs.kill()
        lw.stop()
        if not replica3.is_running():
            replica3.start()
