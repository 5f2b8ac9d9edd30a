"""Staleness against a lag oracle on real replicas (PostgreSQL 15 and 18).

The views lagwatch reads differ by version; the clock that dates what they say does not.
Tests of the clock (a steady stream, bursts, an idle primary, paused replay, a restart while
paused, a cascaded replica) and of a node that does not answer (a refused connection or a
hung one is the same to the poller whatever the server's version) run on the first version
only (``one_pg_version``); those of what the views say where their SQL differs by version
(slots and WAL statistics, a cut-off WAL receiver, the status API) run on both.

Two `lagwatch run` processes watch the module's cluster at once, one polling every second
and one every 100 ms. Each test makes lag real (recovery_min_apply_delay under a steady or
bursty stream of commits, paused replay, a cut-off replica, an idle primary) and checks
every reading against the oracle (tests/integration/oracle.py), which knows the true
staleness at every instant from the commits' own sequence numbers and times.
"""

from __future__ import annotations

import asyncio
import signal
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from chaoscluster import ChaosCluster
from harness import Lagwatch, Reading, Readings, Writer, cluster_config, let_time_pass
from lagwatch.estimate.lsnclock import Staleness, WalDates, date_from_wal
from lagwatch.lsn import format_lsn, parse_lsn
from lagwatch.read.commitscan import CommitScanner
from oracle import LagOracle, OracleLog, nearest_rank, tolerance

WINDOW = 10.0
INTERVALS = {"1s": 1.0, "100ms": 0.1}
SILENCE = 6.0  # how long the idle-primary test keeps the primary silent


@pytest.fixture(scope="module")
def watchers(pg_cluster: ChaosCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Lagwatch]]:
    started = {}
    try:
        for name in INTERVALS:
            started[name] = Lagwatch.for_cluster(tmp_path_factory.mktemp(f"lagwatch-{name}"), pg_cluster,
                                                 interval=name, window=f"{WINDOW:g}s")
        for lw in started.values():
            lw.wait_ready()
        yield started
    finally:
        for lw in started.values():
            lw.stop()


@pytest.fixture
def lagwatch(watchers: dict[str, Lagwatch]) -> Lagwatch:
    """The 1 s watcher, for tests where the interval does not matter."""
    return watchers["1s"]


def lag(lw: Lagwatch, replica: str) -> float | None:
    return lw.value("lagwatch_replica_lag_seconds", replica=replica)


def _labels(**labels: str) -> frozenset[tuple[str, str]]:
    return frozenset({"cluster": "main", **labels}.items())


def _at_most(value: float | None, limit: float) -> bool:
    return value is not None and value <= limit


# The tolerances below are measured beyond the oracle's own bounds, never inside them: its
# truth at an instant is an interval (oracle.py), ``high`` from the earliest the missing
# commit and the replica's progress can have been (the commit's call sent, the probe asked),
# ``low`` from the latest (the call returned, the probe answered), so the oracle's own
# imprecision (a probe every ~2 ms, each a round trip; a commit's call) is already spent. An
# over-read is judged against ``high``, an under-read against ``low``, and what is left is
# the product's promise (docs/lag.md): no over-read past max(5 ms, 10 %), window p95 and
# median within max(10 ms, 20 %).


def _over_reads(readings: list[Reading], log: OracleLog, absolute: float = 0.005,
                relative: float = 0.10) -> list[str]:
    """Readings above the oracle's highest truth by more than max(absolute, relative * it)."""
    out = []
    for r in readings:
        truth = log.truth(r.replica, r.at)
        if r.seconds - truth.high > tolerance(truth.high, absolute, relative):
            out.append(f"{r.replica}@{r.at:.3f}: read {r.seconds * 1000:.1f} ms, truth "
                       f"{truth.low * 1000:.1f}..{truth.high * 1000:.1f} ms ({r.evidence})")
    return out


def _under_reads(readings: list[Reading], log: OracleLog, absolute: float, relative: float) -> list[str]:
    """Readings below the oracle's lowest truth by more than max(absolute, relative * it)."""
    out = []
    for r in readings:
        truth = log.truth(r.replica, r.at)
        if truth.low - r.seconds > tolerance(truth.low, absolute, relative):
            out.append(f"{r.replica}@{r.at:.3f}: read {r.seconds * 1000:.1f} ms, truth "
                       f"{truth.low * 1000:.1f}..{truth.high * 1000:.1f} ms ({r.evidence})")
    return out


def _within(value: float, low: float, high: float, absolute: float, relative: float) -> bool:
    """``value`` within max(absolute, relative * truth) of a truth known to lie in [low, high]."""
    return low - tolerance(low, absolute, relative) <= value <= high + tolerance(high, absolute, relative)


# -- counting the product's cycles ---------------------------------------------------------
# A timing check here counts the cycles lagwatch published, never seconds of a shared host's
# clock. One document (/api/status, or a /metrics scrape) renders one published cycle, so
# the figures read from it agree with each other and with its cycle's number. A cycle whose
# cluster was carried over (lagwatch late for an answer: no evidence, evidence.py) repeats
# the last fresh one's state, so a state is judged only in a cycle tracked afresh.


def _status_when(lw: Lagwatch, what: str, holds: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The first /api/status seen of which ``holds`` (the timeout only guards against a
    hung lagwatch; it is no claim about its speed)."""
    found: list[dict[str, Any]] = []

    def check() -> bool:
        status = lw.status()
        if holds(status):
            found.append(status)
        return bool(found)

    lw.wait_for(what, check, timeout=60)
    return found[0]


def _fresh_status(lw: Lagwatch, cycle: int, what: str) -> dict[str, Any]:
    """/api/status as published by a cycle numbered ``cycle`` or later that tracked the
    cluster afresh."""
    return _status_when(lw, f"{what}: a cycle from {cycle} on, tracked afresh", lambda status: (
        status.get("cycles_total", 0) >= cycle and status["clusters"][0]["carried_cycles"] == 0))


def _replica(status: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in status["clusters"][0]["replicas"] if r["name"] == name)


def _node_up(status: dict[str, Any], name: str) -> bool:
    return bool(next(n for n in status["clusters"][0]["nodes"] if n["name"] == name)["up"])


def _counts(lw: Lagwatch) -> dict[str, float]:
    """The product's own counters, from one /metrics scrape (one published cycle): cycles
    completed, answers lagwatch got to too late (each carried its cluster over a cycle),
    and per node its polls (one per cycle tracked afresh: every node is polled in every
    one) and those answered; per replica its staleness samples and those at most 5 ms."""
    samples = lw.samples()
    out = {"cycles": samples.get(("lagwatch_cycles_total", frozenset()), 0.0),
           "late": samples.get(("lagwatch_late_answers_total", frozenset()), 0.0)}
    for node in ("primary", "replica1", "replica2"):
        polls = samples.get(("lagwatch_polls_total", _labels(node=node)), 0.0)
        errors = sum(v for (name, labels), v in samples.items()
                     if name == "lagwatch_poll_errors_total" and ("node", node) in labels)
        out[f"polls {node}"], out[f"answered {node}"] = polls, polls - errors
    for replica in ("replica1", "replica2"):
        out[f"samples {replica}"] = samples.get(("lagwatch_replica_lag_sampled_seconds_count",
                                                 _labels(replica=replica)), 0.0)
        out[f"at most 5 ms {replica}"] = samples.get(("lagwatch_replica_lag_sampled_seconds_bucket",
                                                      _labels(replica=replica, le="0.005")), 0.0)
    return out


def _moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before[key] for key in after}


def _read_in_cycles(samples: float, tracked: float) -> bool:
    """Whether a replica's staleness samples say it was read in the cycles tracked afresh:
    at most one a cycle, and one in each but where lagwatch itself took the replica's
    answer more than an interval after the primary's, where its last reading stands and
    nothing counts it (history.py: a starved lagwatch, though no answer was late for its
    cycle; at 100 ms beside a CPU-bound process, 0.14-0.18 s apart, one cycle in a hundred
    or so). So at least half of them: only a lagwatch that stopped reading would miss that."""
    return tracked / 2 <= samples <= tracked


# -- millisecond truth under a steady stream ---------------------------------------------


@pytest.mark.one_pg_version
def test_steady_stream_reads_what_the_oracle_reads(pg_cluster: ChaosCluster, watchers: dict[str, Lagwatch],
                                                  tmp_path: Path) -> None:
    """200 commits/s; replica1 applies 20 ms, then 200 ms late, replica2 keeps up (40 ms:
    test_lag_field.py, under OLTP).
    At both intervals, the window p95 and the median reading of replica1 are within
    max(10 ms, 20 %) of the oracle's; replica2's p95 stays under 15 ms. (Seconds of lag:
    the paused-replay and pool tests.)"""
    replica1 = pg_cluster.replicas[0]
    report, failures = [], []
    with LagOracle(pg_cluster, tmp_path / "oracle") as oracle, \
            Readings(watchers["1s"]) as slow, Readings(watchers["100ms"]) as fast:
        collected = {"1s": slow, "100ms": fast}
        for delay in (0.02, 0.2):
            replica1.set_apply_delay(delay)
            # Warm-up: the new delay in force (the replica takes the reload in its own time;
            # nothing says when) and filled in, then one whole window of readings under it.
            let_time_pass(2.0 + 1.5 * delay)
            let_time_pass(WINDOW + 0.5)
            p95s = {f"{name}/{replica}": lw.value("lagwatch_replica_lag_window_seconds", replica=replica,
                                                  quantile="0.95")
                    for name, lw in watchers.items() for replica in ("replica1", "replica2")}
            end = time.monotonic()
            log = oracle.read()
            for name in watchers:
                readings = collected[name].of("replica1", end - WINDOW, end)
                truths = [log.truth("replica1", r.at) for r in readings]
                p95 = p95s[f"{name}/replica1"]
                oracle_p95 = (nearest_rank([t.low for t in truths], 0.95), nearest_rank([t.high for t in truths], 0.95))
                median = statistics.median(r.seconds for r in readings)
                oracle_median = (statistics.median(t.low for t in truths), statistics.median(t.high for t in truths))
                evidence = sorted({r.evidence for r in readings})
                line = (f"delay {delay * 1000:.0f} ms @ {name}: p95 {p95 and p95 * 1000:.1f} ms vs oracle "
                        f"{oracle_p95[0] * 1000:.1f}..{oracle_p95[1] * 1000:.1f}; median {median * 1000:.1f} ms vs "
                        f"{oracle_median[0] * 1000:.1f}..{oracle_median[1] * 1000:.1f} ({len(readings)} readings, "
                        f"{', '.join(evidence)}); replica2 p95 {(p95s[f'{name}/replica2'] or 0) * 1000:.1f} ms")
                report.append(line)
                if p95 is None or not _within(p95, *oracle_p95, 0.010, 0.20):
                    failures.append(f"p95: {line}")
                if not _within(median, *oracle_median, 0.010, 0.20):
                    failures.append(f"median: {line}")
                # replica2 applies at once: under 15 ms, unless the oracle proved it behind
                # (its low bound: its startup process starved on a busy host, 74 ms once at
                # 1 s), then never over what the oracle allows. A high bound alone grows when
                # the oracle's own probes are starved, and must not loosen the limit.
                truths2 = [log.truth("replica2", r.at) for r in collected[name].of("replica2", end - WINDOW, end)]
                low2 = nearest_rank([t.low for t in truths2], 0.95) if truths2 else 0.0
                high2 = nearest_rank([t.high for t in truths2], 0.95) if truths2 else 0.0
                limit2 = 0.015 if low2 <= 0.005 else max(0.015, high2 + tolerance(high2, 0.010, 0.20))
                if not _at_most(p95s[f"{name}/replica2"], limit2):
                    failures.append(f"undelayed replica2 (oracle's p95 {low2 * 1000:.1f}..{high2 * 1000:.1f} ms): "
                                    f"{line}")
    print("\n".join(report))
    assert not failures, "\n".join(failures + ["--- all phases ---"] + report)


@pytest.mark.one_pg_version
def test_bursts_are_seen_and_never_over_read(pg_cluster: ChaosCluster, watchers: dict[str, Lagwatch],
                                            tmp_path: Path) -> None:
    """1 s of 200 commits/s, then 2 s of silence, five times, replica1 60 ms late. Where
    the writes start inside a poll interval, bytes cannot say when: no reading may
    over-read by more than max(5 ms, 10 %), and at 100 ms every burst is seen."""
    delay = 0.06
    pg_cluster.replicas[0].set_apply_delay(delay)
    let_time_pass(1.0)  # the delay in force: the replica takes the reload in its own time
    with Readings(watchers["1s"]) as slow, Readings(watchers["100ms"]) as fast:
        with LagOracle(pg_cluster, tmp_path / "oracle", burst_on=1.0, burst_off=2.0) as oracle:
            let_time_pass(15.0)  # the oracle's five bursts, 3 s apart
            oracle.stop_writes()
        watchers["1s"].wait_cycles(1)  # the readings of the last burst's end
        log = oracle.read()
    assert log.first_commit_at is not None
    start = log.first_commit_at
    over = []
    for name, readings in (("1s", slow), ("100ms", fast)):
        for replica in ("replica1", "replica2"):
            over += [f"{name} {line}" for line in _over_reads(readings.of(replica, start), log)]
    if over:  # what the replica still lacked: which WAL records
        lsns = sorted({r.replay_lsn for readings in (slow, fast) for r in readings.of("replica1", start)
                       if r.replay_lsn and any(f"@{r.at:.3f}" in line for line in over)})
        for lsn in lsns[:3]:
            over.append(f"WAL after {lsn}: " + str(pg_cluster.primary.execute(
                "SELECT start_lsn, resource_manager, record_type, left(description, 80) FROM "
                "pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn + 2000) LIMIT 12", (lsn, lsn))))
    assert not over, "\n".join(over)
    # Every burst: a 100 ms reading of replica1 during it that shows its ~60 ms.
    bursts = [start + 3.0 * k for k in range(5)]
    for burst in bursts:
        # A burst as the oracle wrote it: a stream of commits across its second. The writer
        # is the test's load, not the product: on a host this busy it fell behind its 200
        # commits/s (117 and 140 in a burst's second at a load of 13 on two cores). Fifty,
        # one every 20 ms on average, a third of the replica's 60 ms delay, is a stream.
        assert log.commits_between(burst, burst + 1.0) >= 50, (burst - start, log.commits_between(burst, burst + 1.0))
        seen = [r for r in fast.of("replica1", burst, burst + 1.0 + delay) if r.seconds >= delay / 2]
        assert seen, f"the burst at {burst - start:.1f}s was not seen: {fast.of('replica1', burst, burst + 1.1)}"


# -- the truths that must stay true ------------------------------------------------------


@pytest.mark.one_pg_version
def test_idle_primary_is_not_lag(pg_cluster: ChaosCluster, watchers: dict[str, Lagwatch], tmp_path: Path) -> None:
    """Once the replicas have replayed the last write, every reading is at most 5 ms from
    the next cycle on, and every cycle's stays so through 6 s of silence (where
    now() - pg_last_xact_replay_timestamp() climbs to 6 s: 1,200 times that)."""
    with LagOracle(pg_cluster, tmp_path / "oracle") as oracle:
        let_time_pass(2.0)  # two seconds of the oracle's 200 commits/s before the silence
        oracle.stop_writes()
    pg_cluster.wait_replayed()  # the replicas have everything the primary wrote
    replayed = {name: lw.cycles() for name, lw in watchers.items()}
    with Readings(watchers["1s"]) as slow, Readings(watchers["100ms"]) as fast:
        for name, lw in watchers.items():
            # Two cycles: the one under way when they had replayed it may have read them
            # just before; the next polls replicas with nothing left to replay.
            status = _fresh_status(lw, replayed[name] + 2, f"{name}: the replicas read after the last write")
            read = {r: _replica(status, r)["staleness_seconds"] for r in ("replica1", "replica2")}
            assert all(_at_most(v, 0.005) for v in read.values()), (name, status["cycles_total"], read)
        settled = time.monotonic()
        before = {name: _counts(lw) for name, lw in watchers.items()}
        # What the timestamp-based exporters read meanwhile (any background commit, an
        # autovacuum's, resets it; its peak still shows the climb).
        naive: dict[str, float] = {}
        while time.monotonic() - settled < SILENCE:  # the silence is wall time: what makes the naive signal climb
            for replica in ("replica1", "replica2"):
                age = watchers["1s"].value("lagwatch_replica_last_replay_timestamp_age_seconds", replica=replica)
                naive[replica] = max(naive.get(replica, 0.0), age or 0.0)
            watchers["1s"].wait_cycles(1)
        moved = {name: _moved(before[name], _counts(lw)) for name, lw in watchers.items()}
    for name, readings in (("1s", slow), ("100ms", fast)):
        counts = moved[name]
        tracked = counts["polls primary"]  # cycles tracked afresh through the silence
        assert tracked >= 1 and counts["cycles"] - counts["late"] <= tracked <= counts["cycles"], (name, counts)
        for replica in ("replica1", "replica2"):
            # Read in the cycles tracked afresh, and every reading at most 5 ms.
            taken = counts[f"samples {replica}"]
            assert _read_in_cycles(taken, tracked), (name, replica, counts)
            assert counts[f"at most 5 ms {replica}"] == taken, (name, replica, counts, readings.of(replica, settled))
            seen = readings.of(replica, settled)
            assert seen and max(r.seconds for r in seen) <= 0.005, (name, replica, seen)
    lagwatch = watchers["1s"]
    for replica in ("replica1", "replica2"):
        # The naive signal's climb, the contrast lagwatch's 5 ms is judged beside: past a
        # quarter of the silence. A background commit (autovacuum's ANALYZE of the tables
        # the tests before wrote) resets it wherever it falls: once in mid-silence in a
        # reversed-order run, 6.5 s of 12 (70 % was asked then); up to three such resets
        # still leave one stretch of a quarter (1.5 s of 6: 300 times lagwatch's 5 ms).
        assert naive[replica] > 0.25 * SILENCE, f"the timestamp signal should have climbed: {naive}"
        assert lagwatch.value("lagwatch_replica_streaming", replica=replica) == 1
    # The walsender's time lags are NULL while caught up and idle: exported as 0, not missing.
    # The walsender clears them at the second caught-up reply in a row, which the standby
    # sends each wal_receiver_status_interval (10 s), and the primary logs a running-xacts
    # record up to 15 s after its last write, whose lags clear the same way. Replies each
    # second from here (the silence above was read with the default; heal resets it).
    for replica in pg_cluster.replicas:
        replica.alter_system("wal_receiver_status_interval", "1s")
        replica.reload()
    lagwatch.wait_for("walsender lags NULL, exported as 0", lambda: all(
        lagwatch.value("lagwatch_replica_walsender_lag_seconds", replica=replica, stage=stage) == 0
        for replica in ("replica1", "replica2") for stage in ("write", "flush", "replay")), timeout=30)


@pytest.mark.one_pg_version
def test_paused_replay_grows_with_wall_time(pg_cluster: ChaosCluster, watchers: dict[str, Lagwatch],
                                            tmp_path: Path) -> None:
    """Paused under writes, then the writes stop: the reading follows the oracle to the
    millisecond at both intervals, and keeps growing after the last write."""
    replica1 = pg_cluster.replicas[0]
    with LagOracle(pg_cluster, tmp_path / "oracle") as oracle, \
            Readings(watchers["1s"]) as slow, Readings(watchers["100ms"]) as fast:
        watchers["1s"].wait_cycles(1)  # readings before the pause
        replica1.pause_replay()
        paused = time.monotonic()
        let_time_pass(6.0)  # paused under writes: 6 s behind
        oracle.stop_writes()
        let_time_pass(10.0)  # and growing after the last write, past 15 s
        log = oracle.read()
    for name, readings in (("1s", slow), ("100ms", fast)):
        seen = readings.of("replica1", paused + 1.0)
        assert len(seen) >= 12, (name, seen)
        # Under-reads past max(10 ms, 5 %) of the oracle's low: seconds behind, a reading is
        # dated by the WAL's commit times, put on lagwatch's clock by the primary's quickest
        # answer over 10 s (late by that answer's way back: a few ms), or by the LSN clock,
        # whose history is kept to within 1/64 of its age (1.6 %).
        problems = _over_reads(seen, log) + _under_reads(seen, log, 0.010, 0.05)
        assert not problems, f"{name}:\n" + "\n".join(problems)
        assert seen[-1].seconds > 15.0, (name, seen[-1])
        # The window saw it, and the walsender's frozen replay_lag did not leak in.
        p95 = watchers[name].value("lagwatch_replica_lag_window_seconds", replica="replica1", quantile="0.95")
        assert p95 is not None and p95 > 10, (name, p95)
        assert _at_most(lag(watchers[name], "replica2"), 0.005), name
    lagwatch = watchers["1s"]
    assert lagwatch.value("lagwatch_replica_replay_paused", replica="replica1") == 1
    # What the slot-based exporters see: a paused replica still receives and flushes WAL,
    # so its slot retains (next to) nothing while its replay falls behind.
    retained = lagwatch.value("lagwatch_slot_retained_bytes", slot=replica1.slot_name)
    replay_bytes = lagwatch.value("lagwatch_replica_lag_bytes", replica="replica1", stage="replay")
    assert retained is not None and replay_bytes is not None and replay_bytes > 100_000
    assert retained < replay_bytes / 10, (retained, replay_bytes)

    replica1.resume_replay()
    pg_cluster.wait_replayed()  # its 16 s of backlog replayed (the server's speed, not lagwatch's)
    replayed = {name: lw.cycles() for name, lw in watchers.items()}
    for name, lw in watchers.items():
        # Two cycles: the one under way when it had replayed all may have read it just
        # before; the next reads a replica with nothing left to replay.
        status = _fresh_status(lw, replayed[name] + 2, f"{name}: replica1 read after it caught up")
        reading = _replica(status, "replica1")
        assert _at_most(reading["staleness_seconds"], 0.005), (name, status["cycles_total"], reading)


def test_cut_off_replica_grows_and_is_not_streaming(pg_cluster: ChaosCluster, watchers: dict[str, Lagwatch],
                                                    tmp_path: Path) -> None:
    """replica2 cut off from the primary under writes: it reads not streaming, its
    staleness follows the oracle as it grows with wall time, and from the cycle after
    lagwatch saw it without a walsender it is dated from the WAL past its own position.
    (The primary's WAL read waits for a replica it does not stream to as for one it does,
    and one whose answer comes after the read is read past from where it said it was the
    cycle before: extrareads.py. Before, a replica whose answers kept coming after the read
    was never placed, and read by commit timestamps cycle after cycle.)"""
    replica2 = pg_cluster.replicas[1]
    with LagOracle(pg_cluster, tmp_path / "oracle") as oracle, \
            Readings(watchers["1s"]) as slow, Readings(watchers["100ms"]) as fast:
        watchers["1s"].wait_cycles(1)  # readings before the cut
        replica2.cut_off()
        cut = time.monotonic()
        collected = {"1s": slow, "100ms": fast}
        gone = {}  # the instant of replica2's reading in a cycle that saw no walsender for it
        for name, lw in watchers.items():
            status = _status_when(lw, f"{name}: replica2 not streaming, no walsender for it", lambda status: (
                (r := _replica(status, "replica2"))["streaming"] is False and r["walsender"] is None
                and r["staleness_measured_at_monotonic"] is not None))
            gone[name] = _replica(status, "replica2")["staleness_measured_at_monotonic"]
        let_time_pass(6.0)  # cut off under writes: 6 s more behind
        grown = time.monotonic()
        for name, lw in watchers.items():  # a reading made after the 6 s, collected
            lw.wait_for(f"{name}: replica2 read after the 6 s",
                        lambda name=name: bool(collected[name].of("replica2", grown)), timeout=60)
        log = oracle.read()
    for name, readings in (("1s", slow), ("100ms", fast)):
        seen = readings.of("replica2", cut + 1.0)
        # Under-reads past max(10 ms, 5 %) of the oracle's low: seconds behind, a reading is
        # dated by the WAL's commit times, put on lagwatch's clock by the primary's quickest
        # answer over 10 s (late by that answer's way back: a few ms), or by the LSN clock,
        # whose history is kept to within 1/64 of its age (1.6 %).
        problems = _over_reads(seen, log) + _under_reads(seen, log, 0.010, 0.05)
        assert not problems, f"{name}:\n" + "\n".join(problems)
        # No walsender streams to it any more: the first commit past its own position, read
        # from the primary's WAL, dates it (the LSN clock's interpolation across a second's
        # writes, uneven, under-read 611 ms here once). From the cycle after the one that
        # first showed it without a walsender (that cycle's answer places it for the next
        # read, in time for its read or not), give or take one cycle: a read cancelled at
        # its budget, or not made for want of time left in the cycle (a busy host), is made
        # by the next. Once dated it stays so: the commit read past it stays listed.
        later = readings.of("replica2", gone[name] + 1e-6)
        dated = [i for i, r in enumerate(later) if r.evidence == "wal_commit"]
        assert dated and dated[0] <= 1 and all(r.evidence == "wal_commit" for r in later[dated[0]:]), (name, later)
        # It grew with wall time through the 6 s: it lacks every commit since the cut, the
        # first made within the oracle's 5 ms between commits of the cut (before ``cut``
        # was stamped, which waited for the replica to say it was no longer streaming), and
        # the WAL dates it to the clock offset's few ms (50 ms: tens on a busy host).
        assert seen[-1].at >= grown and seen[-1].seconds >= seen[-1].at - cut - 0.05, (name, cut, seen[-1])
        # The healthy replica is unaffected.
        assert _at_most(lag(watchers[name], "replica1"), 0.005), name
        assert watchers[name].value("lagwatch_replica_streaming", replica="replica2") == 0


@pytest.mark.one_pg_version
def test_a_replica_added_by_a_reload_is_dated_as_one_configured_from_the_start(pg_cluster: ChaosCluster,
                                                                               tmp_path: Path) -> None:
    """A reload that adds a replica while the primary's poller is kept (same poll settings,
    same primary: its session carries over) reaches the primary's WAL reads in the same
    step. replica2, cut off from the primary and then added by SIGHUP, is dated from the
    WAL past its own position as test_cut_off_replica_grows_and_is_not_streaming shows of
    one configured from the start. (The reads once kept the cluster config their poller was
    made with: the added replica was left off the replay board and read by commit
    timestamps in every cycle.)"""
    replica2 = pg_cluster.replicas[1]
    primary_session = "SELECT pid FROM pg_stat_activity WHERE application_name = 'lagwatch/main/primary'"
    (tmp_path / "lagwatch").mkdir()
    with LagOracle(pg_cluster, tmp_path / "oracle"), \
            Lagwatch.for_cluster(tmp_path / "lagwatch", pg_cluster, interval="200ms", window="10s",
                                 replicas=["replica1"]) as lw:
        lw.wait_ready()
        replica2.cut_off()
        session = pg_cluster.primary.scalar(primary_session)
        lw.write_config(cluster_config(pg_cluster, lw.port, interval="200ms", window="10s"))
        with Readings(lw) as readings:
            lw.signal(signal.SIGHUP)
            status = _status_when(lw, "replica2 added by the reload and read", lambda status: any(
                r["name"] == "replica2" and r["staleness_measured_at_monotonic"] is not None
                for r in status["clusters"][0]["replicas"]))
            first = _replica(status, "replica2")["staleness_measured_at_monotonic"]
            lw.wait_cycles(10)
        assert lw.daemon_value("lagwatch_config_last_reload_successful") == 1
        # The precondition of the defect: the primary's poller was kept, not made anew.
        assert pg_cluster.primary.scalar(primary_session) == session
        later = readings.of("replica2", first)
    # From its first reading on, give or take one cycle (its first answer places it for the
    # next read, in time for that read or not), each reading is WAL-dated.
    dated = [i for i, r in enumerate(later) if r.evidence == "wal_commit"]
    assert len(later) >= 8 and dated and dated[0] <= 1, later
    assert all(r.evidence == "wal_commit" for r in later[dated[0]:]), later


@pytest.mark.one_pg_version
def test_restart_while_paused_reads_a_growing_lower_bound(pg_cluster: ChaosCluster, tmp_path: Path) -> None:
    """lagwatch (re)started while replica1 is already seconds behind has no history for
    the change it lacks: it reads a lower bound that grows with wall time, never more
    than the truth."""
    replica1 = pg_cluster.replicas[0]
    with LagOracle(pg_cluster, tmp_path / "oracle") as oracle:
        replica1.pause_replay()
        let_time_pass(3.0)  # replica1 3 s behind before lagwatch starts
        for interval in INTERVALS:
            (tmp_path / f"late-{interval}").mkdir()
            with Lagwatch.for_cluster(tmp_path / f"late-{interval}", pg_cluster, interval=interval,
                                      window=f"{WINDOW:g}s") as lw:
                lw.wait_ready()
                with Readings(lw) as readings:
                    let_time_pass(4.0)  # 4 s of a lower bound growing with wall time
                log = oracle.read()
            seen = readings.of("replica1")
            assert len(seen) >= 3, (interval, seen)
            assert not _over_reads(seen, log), _over_reads(seen, log)
            low = [r for r in seen if r.seconds < 3.0]
            assert not low, (interval, f"{len(low)} of {len(seen)} below 3 s", low[:5])
            grew = seen[-1].seconds - seen[0].seconds
            assert grew >= 0.9 * (seen[-1].at - seen[0].at), (interval, seen[0], seen[-1])
            # Dated by what the clock cannot see past (or, where the WAL may be read, exactly).
            assert {r.evidence for r in seen} <= {"history_start", "walsender", "wal_commit"}, seen


# -- topology and neighbours -------------------------------------------------------------


@pytest.mark.one_pg_version
def test_cascaded_replica_is_measured_end_to_end(pg_cluster: ChaosCluster, lagwatch: Lagwatch) -> None:
    """replica2 streams from replica1 (cascading): the primary has no walsender for it, yet
    its own replay LSN still dates its staleness against the primary's WAL. With replica1
    cut off while the primary writes, replica2 keeps streaming (from replica1, which has
    nothing new) and its staleness still grows with wall time."""
    interval = INTERVALS["1s"]
    replica1, replica2 = pg_cluster.replicas
    replica2.alter_system("primary_slot_name", None)  # its slot lives on the primary
    replica2.set_primary_conninfo(f"host={replica1.host} port={replica1.port} user=postgres "
                                  f"application_name={replica2.application_name}")
    try:
        lagwatch.wait_for("replica2 cascading from replica1", lambda: replica2.is_streaming() and not any(
            row[0] == replica2.application_name
            for row in pg_cluster.primary.execute("SELECT application_name FROM pg_stat_replication")), timeout=20)
        with Writer(pg_cluster):
            lagwatch.wait_cycles(4)
            assert _at_most(lag(lagwatch, "replica2"), 2 * interval)
            assert lagwatch.value("lagwatch_replica_streaming", replica="replica2") == 1
            # The primary cannot see it: no walsender-side signals for it.
            assert lagwatch.value("lagwatch_replica_lag_bytes", replica="replica2", stage="sent") is None

        replica1.cut_off()
        with Writer(pg_cluster) as writer:
            assert writer.first_write_at is not None
            for _ in range(6):
                lagwatch.wait_cycles(1)
                reading = _replica(lagwatch.status(), "replica2")
                got, at = reading["staleness_seconds"], reading["staleness_measured_at_monotonic"]
                # It lacks every write: at its reading's own instant the truth is the time
                # since the first one committed, which the writer knows to its statement's
                # round trip. Two intervals: where the WAL read does not date it, the LSN
                # clock brackets what it lacks between two polls of the primary, an interval
                # apart (two where a busy host stretched one).
                assert got is not None and at is not None and abs(got - (at - writer.first_write_at)) <= 2 * interval, \
                    (got, at - writer.first_write_at, reading["staleness_evidence"])
            assert got is not None and got >= 4, got  # six cycles since the writes began, each at least an interval
            assert lagwatch.value("lagwatch_replica_streaming", replica="replica2") == 1
            assert lagwatch.value("lagwatch_replica_streaming", replica="replica1") == 0
    finally:
        replica1.reconnect(wait=True)
        replica2.restore_auto_conf()
        lagwatch.wait_for("replica2 back on the primary", lambda: any(
            row[0] == replica2.application_name
            for row in pg_cluster.primary.execute("SELECT application_name FROM pg_stat_replication "
                                                  "WHERE state = 'streaming'")), timeout=30)
        pg_cluster.wait_replayed()
    lagwatch.wait_for("both replicas caught up",
                      lambda: all(_at_most(lag(lagwatch, r), 2 * interval) for r in ("replica1", "replica2")),
                      timeout=10)


def test_inactive_slot_retains_wal_and_wal_stats_move(pg_cluster: ChaosCluster, lagwatch: Lagwatch) -> None:
    before = lagwatch.samples()
    retained_before = before[("lagwatch_slot_retained_bytes", _labels(slot="inactive"))]
    with Writer(pg_cluster, every=0.05):
        lagwatch.wait_for("the inactive slot to retain 100 kB more", lambda: (lagwatch.value(
            "lagwatch_slot_retained_bytes", slot="inactive") or 0) > retained_before + 100_000, timeout=20)
    after = lagwatch.samples()
    # WAL counters: pg_stat_wal (14+) and pg_walinspect (installed by the fixture) both see the writes.
    for name, labels in (("lagwatch_wal_bytes_total", _labels(node="primary")),
                         ("lagwatch_wal_records_total", _labels(node="primary")),
                         ("lagwatch_wal_inspected_bytes_total", _labels())):
        # (pg_walinspect is read every 10 s)
        lagwatch.wait_for(f"{name} to move", lambda name=name, labels=labels: (lagwatch.samples().get((name, labels))
                                                                              or 0) > before.get((name, labels), 0),
                          timeout=15)
    if pg_cluster.binaries.major >= 14:
        # pg_stat_wal's bytes (rooms/wal.py) as the server counts them, bracketed by two reads.
        stat_sql = "SELECT wal_bytes::bigint FROM pg_stat_wal"
        first = int(pg_cluster.primary.scalar(stat_sql))
        lagwatch.wait_cycles(2)
        read = lagwatch.value("lagwatch_wal_bytes_total", node="primary")
        last = int(pg_cluster.primary.scalar(stat_sql))
        assert read is not None and first <= read <= last, (first, read, last)
    assert after[("lagwatch_wal_rate_bytes_per_second", _labels())] > 0
    # pg_wal's size (rooms/wal_dir.py), the primary's: the server's own sum over the cycle
    # lagwatch published after the writes, bracketed by two reads of it (no writes between,
    # so a segment recycled by a checkpoint is the only change).
    wal_dir_sql = "SELECT coalesce(sum(size), 0)::bigint FROM pg_ls_waldir()"
    first = int(pg_cluster.primary.scalar(wal_dir_sql))
    lagwatch.wait_cycles(2)
    read = lagwatch.value("lagwatch_wal_directory_bytes", node="primary")
    last = int(pg_cluster.primary.scalar(wal_dir_sql))
    assert read is not None and min(first, last) <= read <= max(first, last), (first, read, last)
    assert lagwatch.value("lagwatch_wal_directory_files", node="primary") is not None
    method = "pglz" if pg_cluster.binaries.major < 15 else pg_cluster.primary.scalar("SHOW wal_compression")
    assert after[("lagwatch_wal_compression_info", _labels(node="primary", method=method))] == 1
    has_write_counters = ("lagwatch_wal_writes_total", _labels(node="primary")) in after
    assert has_write_counters == (pg_cluster.binaries.major < 18)
    assert lagwatch.value("lagwatch_slot_active", slot="inactive") == 0
    assert lagwatch.value("lagwatch_slot_active", slot="replica1") == 1
    assert lagwatch.value("lagwatch_slot_safe_wal_size_bytes", slot="inactive") is not None
    assert lagwatch.value("lagwatch_slot_wal_status", slot="inactive", status="reserved") == 1
    # PostgreSQL 17+ says since when a slot is inactive.
    inactive_for = lagwatch.value("lagwatch_slot_inactive_seconds", slot="inactive")
    if pg_cluster.binaries.major >= 17:
        assert inactive_for is not None and inactive_for > 0
    else:
        assert inactive_for is None


def test_a_read_with_no_whole_record_past_its_start_dates_nothing_missing(pg_cluster: ChaosCluster) -> None:
    """pg_walinspect fails a whole statement where no whole record follows a range's start
    (a replica caught up to the last whole record while the next is still being written):
    the real server's error, parsed, marks that range as holding nothing anyone can see,
    and the read is not lost. Deterministic here: a read from just past the start of the
    idle primary's last record (its version's message is what is checked)."""
    primary = pg_cluster.primary

    async def attempt() -> tuple[int, CommitScanner, dict[str, WalDates]] | None:
        async with await psycopg.AsyncConnection.connect(primary.dsn(), autocommit=True) as conn:
            flush = await _lsn(conn, "SELECT pg_current_wal_flush_lsn()")
            last = await _lsn(conn, "SELECT max(start_lsn) FROM pg_get_wal_records_info("
                                    f"'{format_lsn(flush - 8192)}'::pg_lsn, '{format_lsn(flush)}'::pg_lsn)")
            scanner = CommitScanner(max_bytes=1 << 20, locate=False)
            dates = await scanner.scan(conn, (), flush, "main", 5.0, lambda *a: None, own={"r": last + 1})
            if await _lsn(conn, "SELECT pg_current_wal_flush_lsn()") != flush:
                return None  # the primary wrote meanwhile (a checkpoint, autovacuum): again
            return last, scanner, dates

    for _ in range(5):
        if (done := asyncio.run(attempt())) is not None:
            break
    else:
        pytest.fail("the primary never sat idle for a read")
    last, scanner, dates = done
    assert scanner.state is True and scanner.totals.failed == 0, scanner.totals
    assert scanner.totals.retried == 1, scanner.totals
    assert dates["r"].complete and dates["r"].commits == (), dates
    assert date_from_wal(last + 1, time.monotonic(), dates["r"]) == Staleness(0.0, "wal_commit")


async def _lsn(conn: psycopg.AsyncConnection[Any], sql: str) -> int:
    row = await (await conn.execute(sql)).fetchone()
    lsn = parse_lsn(str(row[0])) if row is not None else None
    assert lsn is not None, sql
    return lsn


@pytest.mark.one_pg_version
@pytest.mark.parametrize("how", ["stopped", "frozen"])
def test_unanswering_node_is_down_alone(pg_cluster: ChaosCluster, watchers: dict[str, Lagwatch], how: str) -> None:
    """A stopped or hung replica is down within three cycles; the other nodes answer in
    every cycle meanwhile, at both intervals."""
    replica2 = pg_cluster.replicas[1]
    # Up in both watchers' eyes first: a replica the previous test's repair restarted may
    # still read down to the 1 s watcher, which would then log no new "down" line.
    for lw in watchers.values():
        lw.wait_for("replica2 up before the test", lambda lw=lw: lw.value("lagwatch_up", node="replica2") == 1,
                    timeout=30)
    logged = {name: len(lw.log_text()) for name, lw in watchers.items()}
    if how == "stopped":
        replica2.stop()
    else:
        replica2.freeze()  # a hung host: only the client-side deadline can save the cycle
    went = {name: lw.cycles() for name, lw in watchers.items()}
    for name, lw in watchers.items():
        # Three cycles: the one under way when it went may have had its answer before; the
        # next may take that same poll's answer a cycle late (lagwatch late for it on a busy
        # host: that cycle is carried over, not fresh); the one after polls a node that is
        # gone, and hears the refused connection or, hung, the silence of a whole budget.
        status = _fresh_status(lw, went[name] + 3, f"{name}: replica2 read after it went")
        assert not _node_up(status, "replica2"), (name, status["cycles_total"], status["clusters"][0]["nodes"])
        assert _node_up(status, "primary") and _node_up(status, "replica1"), (name, status["clusters"][0]["nodes"])
    # The other nodes keep their cadence: in every cycle they answered, and replica1 was
    # read. Counted in the product's own cycles, each end read from one scrape (one scrape
    # renders one published cycle, so no cycle is in flight between its counters).
    before = {name: _counts(lw) for name, lw in watchers.items()}
    watchers["1s"].wait_cycles(5)  # five of the 1 s watcher's cycles, fifty or so of the other's
    for name, lw in watchers.items():
        counts = _moved(before[name], _counts(lw))
        tracked = counts["polls replica2"]  # every node is polled in every cycle tracked afresh
        # Every cycle tracked afresh but those carried over for an answer lagwatch got to too
        # late (lagwatch's own lateness: no evidence about any node).
        assert tracked >= 1 and counts["cycles"] - counts["late"] <= tracked <= counts["cycles"], (name, counts)
        assert counts["answered primary"] == counts["answered replica1"] == tracked, (name, counts)
        assert counts["answered replica2"] == 0, (name, counts)
        assert _read_in_cycles(counts["samples replica1"], tracked), (name, counts)
        assert lw.value("lagwatch_up", node="replica2") == 0
    if how == "stopped":
        replica2.start()
    else:
        replica2.thaw()
    for lw in watchers.values():
        lw.wait_for("replica2 back up", lambda lw=lw: lw.value("lagwatch_up", node="replica2") == 1, timeout=15)
    # lagwatch's own lines, one when it went down (with why) and one when it came back;
    # none of psycopg's (which names no node).
    for name, lw in watchers.items():
        log = lw.log_text()[logged[name]:]
        down = [line for line in log.splitlines() if "main/replica2: down: " in line]
        up = [line for line in log.splitlines() if "main/replica2: up again after " in line]
        assert down and all("WARNING lagwatch.nodes" in line for line in down), (name, down)
        assert len(up) == len(down) and all("INFO lagwatch.nodes" in line for line in up), (name, down, up)
        assert " psycopg" not in log and "AsyncPipeline" not in log, name


def test_status_api_and_health(watchers: dict[str, Lagwatch]) -> None:
    for lw in watchers.values():
        status = lw.status()
        assert status["ready"] is True
        (cluster,) = status["clusters"]
        names = [r["name"] for r in cluster["replicas"]]
        assert names == ["replica1", "replica2"]
        assert all(r["staleness_evidence"] and r["staleness_measured_at_monotonic"] for r in cluster["replicas"])
        assert lw.get("/healthz")[0] == 200
        assert lw.get("/readyz")[0] == 200
        assert lw.get("/nope")[0] == 404
        page = lw.get("/status")
        assert page[0] == 200 and "max_lag" in page[1]
