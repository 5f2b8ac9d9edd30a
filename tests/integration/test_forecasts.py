"""Forecasts against what then happens, on real servers: a replica's catch-up ETA and a
slot's runway against the oracle's own forecast from what it measured of the same
positions over the same horizon, then lived through (the replica catches up, the slot's
wal_status becomes unreserved or lost) and a replica that cannot catch up reading +Inf (and
its alert firing on a real Prometheus).

WAL is written at a steady rate with pg_logical_emit_message (no table grows); the WAL a
replica gets is capped at a chosen rate by a relay between it and the primary (a replica on
a capped volume or link). (Pausing and resuming replay cannot throttle it: such records
replay at GB/s, so any resume catches up at once.) A forecast assumes the rates it measured
hold; on a busy host the test's own writer and relay (Python threads) hold theirs only on
average (both keep an absolute schedule: see ThrottledLink), so what comes true is judged
against the rates the oracle measured (``Positions``), not the ones set. What is measured
does not depend on the server version: one version runs these.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from chaoscluster import ChaosCluster
from harness import ROOT, Lagwatch, cluster_config
from lagwatch.demo.ports import free_port
from lagwatch.demo.servers import LocalReplica, LocalServer
from lagwatch.lsn import parse_lsn
from prom_stack import Prometheus, rules_with_shorter_for
from throttled_link import ThrottledLink

pytestmark = pytest.mark.one_pg_version

INTERVAL = 0.5
HORIZON = 5.0  # the forecast horizon lagwatch measures its rates over
RULES = ROOT / "alerts" / "lagwatch.rules.yml"
MB = 1 << 20


class SteadyWal(threading.Thread):
    """Writes ``rate`` bytes of WAL a second on the primary, in 10 steps a second."""

    def __init__(self, cluster: ChaosCluster, rate: float, max_seconds: float = 120) -> None:
        super().__init__(daemon=True)
        self.cluster, self.step = cluster, int(rate / 10)
        self.deadline = time.monotonic() + max_seconds
        self.stopped = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.cluster.primary.dsn(), autocommit=True) as conn:
            next_at = time.monotonic()
            while not self.stopped.is_set() and time.monotonic() < self.deadline:
                conn.execute("SELECT pg_logical_emit_message(false, 'lagwatch-test', repeat('x', %s))", (self.step,))
                next_at += 0.1
                self.stopped.wait(max(0.0, next_at - time.monotonic()))

    def __enter__(self) -> SteadyWal:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.join(10)


@pytest.fixture
def lagwatch(pg_cluster: ChaosCluster, tmp_path: Path) -> Iterator[Lagwatch]:
    config = cluster_config(pg_cluster, free_port(["127.0.0.1"]), interval=f"{int(INTERVAL * 1000)}ms", window="1m",
                            state_dir=str(tmp_path / "state"), forecast_horizon=f"{HORIZON:g}s")
    with Lagwatch(tmp_path, config) as lw:
        lw.wait_ready()
        yield lw


class Positions(threading.Thread):
    """The oracle: the positions the servers themselves report (each a counter that only
    grows), read every 0.1 s on its own connections, each with the instants it was asked
    and answered (it was true at some moment between). Bounded in time."""

    def __init__(self, queries: dict[str, tuple[LocalServer, str]], max_seconds: float = 120) -> None:
        super().__init__(daemon=True)
        self.queries = queries
        self.samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in queries}
        self.deadline = time.monotonic() + max_seconds
        self.stopped = threading.Event()

    def run(self) -> None:
        with contextlib.ExitStack() as stack:
            conns = {name: stack.enter_context(psycopg.connect(server.dsn(), autocommit=True))
                     for name, (server, _) in self.queries.items()}
            next_at = time.monotonic()
            while not self.stopped.is_set() and time.monotonic() < self.deadline:
                for name, (_, sql) in self.queries.items():
                    asked = time.monotonic()
                    row = conns[name].execute(sql).fetchone()
                    if row is not None and row[0] is not None:
                        self.samples[name].append((asked, time.monotonic(), float(row[0])))
                next_at += 0.1
                self.stopped.wait(max(0.0, next_at - time.monotonic()))

    def __enter__(self) -> Positions:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.join(10)

    def bounds(self, name: str, at: float) -> tuple[float, float]:
        """What ``name`` was at ``at``: at least what a read answered by then said, at most
        what a read asked after it said (a counter that only grows; a decreasing one, such
        as safe_wal_size, the other way round)."""
        rows = self.samples[name]
        before = [v for _, answered, v in rows if answered <= at]
        after = [v for asked, _, v in rows if asked >= at]
        assert before and after, (name, at)
        return (before[-1], after[0]) if before[-1] <= after[0] else (after[0], before[-1])

    def rate(self, name: str, start: float, end: float) -> tuple[float, float]:
        """Bytes a second between ``start`` and ``end``, least and most (``bounds``)."""
        (a_lo, a_hi), (b_lo, b_hi) = self.bounds(name, start), self.bounds(name, end)
        return (b_lo - a_hi) / (end - start), (b_hi - a_lo) / (end - start)

    def located(self, name: str, value: float) -> tuple[float, float]:
        """When the growing counter ``name`` was at ``value``: after a read that said less
        was asked, before one that said more was answered."""
        rows = self.samples[name]
        after = [asked for asked, _, v in rows if v < value]
        before = [answered for _, answered, v in rows if v > value]
        assert after and before, (name, value)
        return max(after), min(before)

    def change(self, name: str, start: float, end: float) -> float:
        """The mean rate between two instants, from the reads nearest them (for the record)."""
        rows = self.samples[name]
        a = min(rows, key=lambda r: abs(r[0] - start))
        b = min(rows, key=lambda r: abs(r[0] - end))
        return (b[2] - a[2]) / (b[0] - a[0]) if b[0] > a[0] else math.nan


def windows(end_from: float, end_to: float) -> Iterator[tuple[float, float]]:
    """Every (start, end) lagwatch's horizon can have measured a rate over, on a grid of 50 ms:
    ending when its read was true (between ``end_from`` and ``end_to``), starting HORIZON
    before that or up to two intervals more (rates.Progress keeps the newest sample at least
    HORIZON old, older by up to the gap to the next: a cycle's, two for a late one)."""
    ends = [end_from + k * 0.05 for k in range(int((end_to - end_from) / 0.05) + 1)] + [end_to]
    for end in ends:
        for d in range(0, round(2 * INTERVAL / 0.05) + 1):
            yield end - HORIZON - d * 0.05, end


def backlog(cluster: ChaosCluster, replica: LocalReplica) -> int:
    """What the primary has written and the replica has not replayed, read from both."""
    current = int(cluster.primary.scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"))
    return current - int(replica.scalar("SELECT pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0')::bigint"))


def burst(cluster: ChaosCluster, size: int) -> None:
    """``size`` bytes of WAL at once, in 1 MB messages: a backlog without waiting for one."""
    with psycopg.connect(cluster.primary.dsn(), autocommit=True) as conn:
        for _ in range(size // MB):
            conn.execute("SELECT pg_logical_emit_message(false, 'lagwatch-test', repeat('x', %s))", (MB,))


def forecast_range(oracle: Positions, left: float, *, written: str, primary_lsn: float, replayed: str | None = None,
                   replica_at: float | None = None) -> tuple[float, float, str]:
    """The oracle's own forecast for what lagwatch read as ``left`` bytes (a backlog, a
    slot's safe_wal_size) with the primary at ``primary_lsn``: least and most over every
    window its horizon can have covered (``windows``) and every value each of the
    oracle's reads can have been (``Positions.bounds``). Its width is the oracle's whole
    uncertainty: lagwatch's forecast must lie inside it. A catch-up (``replayed``, read by
    lagwatch at ``replica_at``): over the replay rate less the WAL rate (``written``); a
    runway: over the WAL rate."""
    start, end = oracle.located(written, primary_lsn)  # when lagwatch's primary read was true
    write = [oracle.rate(written, s, e) for s, e in windows(start, end)]
    if replayed is not None:
        assert replica_at is not None
        replay = [oracle.rate(replayed, s, e) for s, e in windows(replica_at, replica_at)]
        net_low = min(r[0] for r in replay) - max(w[1] for w in write)
        net_high = max(r[1] for r in replay) - min(w[0] for w in write)
    else:
        net_low, net_high = min(w[0] for w in write), max(w[1] for w in write)
    assert net_high > 0, (net_low, net_high)
    low, high = left / net_high, (left / net_low if net_low > 0 else math.inf)
    return low, high, f"{left / MB:.1f} MB at {net_low / MB:.2f}..{net_high / MB:.2f} MB/s"


PRIMARY_LSN = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"
REPLAY_LSN = "SELECT pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0')::bigint"


def test_the_catch_up_eta_comes_true_and_a_replica_too_slow_reads_inf(pg_cluster: ChaosCluster,
                                                                       lagwatch: Lagwatch, tmp_path: Path) -> None:
    """... and the shipped LagwatchReplicaNotCatchingUp fires on a real Prometheus (its 5m
    for: 60 times shorter here; promtool's tests hold the real one)."""
    lw = lagwatch
    primary, r1 = pg_cluster.primary, pg_cluster.replicas[0]
    prometheus = Prometheus([f"127.0.0.1:{lw.port}"], [rules_with_shorter_for(RULES, tmp_path, factor=60)])
    prometheus.start()
    with contextlib.ExitStack() as stack, ThrottledLink(primary.host, primary.port) as link:
        stack.callback(prometheus.stop)
        r1.set_primary_conninfo(f"host={link.host} port={link.port} user=postgres "
                                f"application_name={r1.application_name}")
        lw.wait_for("replica1 streaming through the link", r1.is_streaming, 20)
        with SteadyWal(pg_cluster, 4 * MB), Positions({"written": (primary, PRIMARY_LSN),
                                                       "replayed": (r1, REPLAY_LSN)}) as oracle:
            link.set_rate(0)  # held: replica1 gets nothing
            burst(pg_cluster, 24 * MB)  # most of the backlog at once, long out of the horizon when it is read
            lw.wait_for("~28 MB behind", lambda: backlog(pg_cluster, r1) >= 28 * MB, 30)
            # 6 MB/s get through while 4 MB/s are written: the backlog shrinks at 2 MB/s (~14 s).
            link.set_rate(6 * MB)
            lw.wait_for("a finite catch-up ETA", lambda: 0 < (lw.value(
                "lagwatch_replica_catchup_eta_seconds", replica="replica1") or 0) < math.inf, 15)
            # A whole forecast horizon into the catch-up, counted in lagwatch's cycles (and
            # one more, for the reading it was read in): the replay rate is the link's now,
            # not partly the held spell's (an ETA read sooner is long by that spell).
            lw.wait_cycles(round(HORIZON / INTERVAL) + 2)
            cluster = lw.status()["clusters"][0]
            status = next(r for r in cluster["replicas"] if r["name"] == "replica1")
            predicted, reading_at = status["catch_up"]["eta_seconds"], status["staleness_measured_at_monotonic"]
            assert predicted is not None and 0 < predicted < math.inf, status["catch_up"]
            # The primary's position that cycle: the oracle finds when its read was true.
            primary_lsn = parse_lsn(cluster["primary_lsn"])
            assert primary_lsn is not None
            assert status["catch_up"]["summary"].startswith("catching up, ~"), status["catch_up"]
            # Caught up: less than a quarter second of writes behind, read from both servers.
            lw.wait_for("replica1 caught up", lambda: backlog(pg_cluster, r1) <= MB, 120)
            caught = time.monotonic()
            # The oracle's forecast from the backlog and rates it read itself, over the windows
            # lagwatch's reading can have measured: the forecast must be that one. What it
            # then took is the record of whether the test's writer and relay held those rates
            # (a forecast cannot know they will not).
            low, high, basis = forecast_range(oracle, status["catch_up"]["backlog_bytes"], written="written",
                                              primary_lsn=primary_lsn, replayed="replayed", replica_at=reading_at)
            took = caught - reading_at
            print(f"catch-up: ETA {predicted:.1f} s, the oracle's {low:.1f}..{high:.1f} s ({basis}); took "
                  f"{took:.1f} s at {oracle.change('written', reading_at, caught) / MB:.2f} MB/s written, "
                  f"{oracle.change('replayed', reading_at, caught) / MB:.2f} MB/s replayed")
            assert low <= predicted <= high, (predicted, low, high, basis)
            lw.expect("lagwatch_replica_catchup_eta_seconds", 0, timeout=10, replica="replica1")

            # 2 MB/s get through while 4 MB/s are written: it never catches up.
            link.set_rate(2 * MB)
            lw.wait_for("ETA +Inf", lambda: lw.value("lagwatch_replica_catchup_eta_seconds", replica="replica1")
                        == math.inf, 20)
            # The rate is taken over the horizon: once that holds only the capped link, 2 MB/s,
            # give or take what the link may make up at once (CATCH_UP: 0.5 s of it, a tenth of
            # the horizon's bytes) and a WAL message either end: a quarter.
            lw.wait_for("the replay rate of the capped link", lambda: 1.5 * MB < (lw.value(
                "lagwatch_replica_replay_rate_bytes_per_second", replica="replica1") or 0) < 2.5 * MB, 15)
            assert lw.value("lagwatch_replica_catchup_eta_seconds", replica="replica1") == math.inf
            status = next(r for r in lw.status()["clusters"][0]["replicas"] if r["name"] == "replica1")
            assert status["catch_up"]["falling_behind"] and status["catch_up"]["summary"].startswith(
                "falling behind, "), status["catch_up"]

            def firing() -> bool:
                return any(a["labels"]["alertname"] == "LagwatchReplicaNotCatchingUp" and a["state"] == "firing"
                           and a["labels"].get("replica") == "replica1" for a in prometheus.alerts())

            lw.wait_for("LagwatchReplicaNotCatchingUp firing on Prometheus", firing, 40)
        link.set_rate(None)


def test_a_slots_runway_ends_when_its_wal_becomes_unreserved(pg_cluster: ChaosCluster, lagwatch: Lagwatch) -> None:
    lw = lagwatch
    primary = pg_cluster.primary
    primary.alter_system("max_slot_wal_keep_size", "64MB")
    primary.reload()
    # A physical slot reserves from the last checkpoint's redo pointer: make that now.
    primary.execute("CHECKPOINT")
    primary.execute("SELECT pg_create_physical_replication_slot('forgotten', true)")  # no consumer, ever
    try:
        lw.wait_for("the slot's runway (not shrinking yet)", lambda: lw.value(
            "lagwatch_slot_runway_seconds", slot="forgotten") is not None, 10)
        burst(pg_cluster, 36 * MB)  # half its 64 MB at once, long out of the horizon when it is read
        with SteadyWal(pg_cluster, 3 * MB), Positions({"written": (primary, PRIMARY_LSN)}) as oracle:
            # A whole forecast horizon of steady writing and the two intervals more it may keep,
            # counted in lagwatch's cycles (and one for the reading it is read in, one for the
            # oracle's first read): the net rate is this one, the burst out of it.
            lw.wait_cycles(round(HORIZON / INTERVAL) + 4)

            def reading() -> dict[str, Any] | None:
                # From a cycle the primary answered (on a loaded machine one may come too late
                # for its cycle, which then says nothing of the slot).
                c = lw.status()["clusters"][0]
                slot = next((s for s in c["slots"] if s["name"] == "forgotten"), None)
                return {**slot, "primary_lsn": c["primary_lsn"]} if slot and slot["runway_seconds"] else None

            readings: list[dict[str, Any] | None] = []
            lw.wait_for("the slot's runway", lambda: readings.append(reading()) or readings[-1] is not None, 5)
            slot = readings[-1]
            assert slot is not None
            predicted, primary_lsn = slot["runway_seconds"], parse_lsn(slot["primary_lsn"])
            reading_at = time.monotonic()
            assert 0 < predicted < math.inf and primary_lsn is not None, slot

            def gone() -> bool:
                return primary.scalar("SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'forgotten'") \
                    in ("unreserved", "lost")

            lw.wait_for("wal_status unreserved or lost", gone, 120)
            ended = time.monotonic()
            # As for the catch-up: the oracle's own forecast from the safe_wal_size lagwatch
            # read and the WAL rate over the windows its reading can have measured.
            low, high, basis = forecast_range(oracle, slot["safe_wal_size"], written="written",
                                              primary_lsn=primary_lsn)
            print(f"slot runway: forecast {predicted:.1f} s, the oracle's {low:.1f}..{high:.1f} s ({basis}); "
                  f"unreserved after {ended - reading_at:.1f} s at "
                  f"{oracle.change('written', reading_at, ended) / MB:.2f} MB/s written")
        assert low <= predicted <= high, (predicted, low, high, basis)
    finally:
        primary.execute("SELECT pg_drop_replication_slot('forgotten')")
