"""Staleness against a lag oracle on real replicas (PostgreSQL 15 and 18).

The views lagwatch reads differ by version; the clock that dates what they say does not.
Tests of the clock (a steady stream, bursts, an idle primary, paused replay, a restart while
paused, a cascaded replica) run on the first version only (``one_pg_version``); those of
what the views say where their SQL differs by version (slots and WAL statistics, a cut-off
WAL receiver, a node that does not answer, the status API) run on both.

Two `lagwatch run` processes watch the module's cluster at once, one polling every second
and one every 100 ms. Each test makes lag real (recovery_min_apply_delay under a steady or
bursty stream of commits, paused replay, a cut-off replica, an idle primary) and checks
every reading against the oracle (tests/integration/oracle.py), which knows the true
staleness at every instant from the commits' own sequence numbers and times.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from chaoscluster import ChaosCluster
from harness import Lagwatch, Reading, Readings, Writer, let_time_pass
from lagwatch.commitscan import CommitScanner
from lagwatch.lag import Staleness, WalDates, date_from_wal
from lagwatch.lsn import format_lsn, parse_lsn
from oracle import LagOracle, OracleLog, nearest_rank, tolerance

WINDOW = 10.0
INTERVALS = {"1s": 1.0, "100ms": 0.1}
SILENCE = 12.0  # how long the idle-primary test keeps the primary silent


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


def _over_reads(readings: list[Reading], log: OracleLog, absolute: float = 0.005,
                relative: float = 0.10) -> list[str]:
    """Readings above the truth by more than max(absolute, relative * truth)."""
    out = []
    for r in readings:
        truth = log.truth(r.replica, r.at)
        if r.seconds - truth.high > tolerance(truth.high, absolute, relative):
            out.append(f"{r.replica}@{r.at:.3f}: read {r.seconds * 1000:.1f} ms, truth "
                       f"{truth.low * 1000:.1f}..{truth.high * 1000:.1f} ms ({r.evidence})")
    return out


def _under_reads(readings: list[Reading], log: OracleLog, absolute: float, relative: float) -> list[str]:
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
                if not _at_most(p95s[f"{name}/replica2"], 0.015):
                    failures.append(f"undelayed replica2: {line}")
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
        seen = [r for r in fast.of("replica1", burst, burst + 1.0 + delay) if r.seconds >= delay / 2]
        assert seen, f"the burst at {burst - start:.1f}s was not seen: {fast.of('replica1', burst, burst + 1.1)}"
        assert log.commits_between(burst, burst + 1.0) > 150


# -- the truths that must stay true ------------------------------------------------------


@pytest.mark.one_pg_version
def test_idle_primary_is_not_lag(pg_cluster: ChaosCluster, watchers: dict[str, Lagwatch], tmp_path: Path) -> None:
    """Within 3 s of the last write every reading is at most 5 ms, and stays so for 12 s
    of silence (where now() - pg_last_xact_replay_timestamp() climbs to 12 s)."""
    with LagOracle(pg_cluster, tmp_path / "oracle") as oracle:
        let_time_pass(2.0)  # two seconds of the oracle's 200 commits/s before the silence
        last_write = oracle.stop_writes()
    with Readings(watchers["1s"]) as slow, Readings(watchers["100ms"]) as fast:
        for lw in watchers.values():
            lw.wait_for("every replica at most 5 ms", lambda lw=lw: all(
                _at_most(lag(lw, r), 0.005) for r in ("replica1", "replica2")), timeout=3.0)
        assert time.monotonic() - last_write <= 3.5
        settled = time.monotonic()
        # What the timestamp-based exporters read meanwhile (any background commit, an
        # autovacuum's, resets it; its peak still shows the climb).
        naive: dict[str, float] = {}
        while time.monotonic() - settled < SILENCE:
            for replica in ("replica1", "replica2"):
                age = watchers["1s"].value("lagwatch_replica_last_replay_timestamp_age_seconds", replica=replica)
                naive[replica] = max(naive.get(replica, 0.0), age or 0.0)
            watchers["1s"].wait_cycles(1)
    for name, readings in (("1s", slow), ("100ms", fast)):
        for replica in ("replica1", "replica2"):
            seen = readings.of(replica, settled)
            assert len(seen) >= 0.8 * SILENCE / INTERVALS[name], (name, replica, len(seen))
            worst = max(r.seconds for r in seen)
            assert worst <= 0.005, (name, replica, worst)
    lagwatch = watchers["1s"]
    for replica in ("replica1", "replica2"):
        assert naive[replica] > 0.7 * SILENCE, f"the timestamp signal should have climbed: {naive}"
        assert lagwatch.value("lagwatch_replica_streaming", replica=replica) == 1
    # The walsender's time lags are NULL while caught up and idle: exported as 0, not missing.
    # (The primary logs a running-xacts record 15 s after its last activity, and the lags it
    # measures for that clear only at the standby's next reply, up to 10 s later: wait.)
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
    resumed = time.monotonic()
    for name, lw in watchers.items():
        lw.wait_for(f"{name}: replica1 caught up", lambda lw=lw: _at_most(lag(lw, "replica1"), 0.005), timeout=10)
        assert time.monotonic() - resumed <= 2 * INTERVALS[name] + 1.0, name


def test_cut_off_replica_grows_and_is_not_streaming(pg_cluster: ChaosCluster, watchers: dict[str, Lagwatch],
                                                    tmp_path: Path) -> None:
    replica2 = pg_cluster.replicas[1]
    with LagOracle(pg_cluster, tmp_path / "oracle") as oracle, \
            Readings(watchers["1s"]) as slow, Readings(watchers["100ms"]) as fast:
        watchers["1s"].wait_cycles(1)  # readings before the cut
        replica2.cut_off()
        cut = time.monotonic()
        for lw in watchers.values():
            lw.wait_for("replica2 not streaming",
                        lambda lw=lw: lw.value("lagwatch_replica_streaming", replica="replica2") == 0, timeout=10)
        let_time_pass(6.0)  # cut off under writes: 6 s more behind
        log = oracle.read()
    for name, readings in (("1s", slow), ("100ms", fast)):
        seen = readings.of("replica2", cut + 1.0)
        problems = _over_reads(seen, log) + _under_reads(seen, log, 0.010, 0.05)
        assert not problems, f"{name}:\n" + "\n".join(problems)
        # No walsender streams to it any more: the first commit past its own position,
        # read from the primary's WAL, dates it once read (the LSN clock's interpolation
        # across a second's writes, uneven, under-read 611 ms here once; the first cycle
        # after the cut may be commit timestamps').
        later = [r for r in seen if r.at > cut + 1.0 + 2 * INTERVALS[name]]
        assert later and {r.evidence for r in later} == {"wal_commit"}, (name, seen)
        # It grew with wall time through the 6 s (a reading is as of its own poll, which
        # may come a few ms before the sleep's end: compare with its own time).
        assert seen[-1].at - cut >= 5.0 and seen[-1].seconds >= seen[-1].at - cut - 0.05, (name, cut, seen[-1])
        # The healthy replica is unaffected.
        assert _at_most(lag(watchers[name], "replica1"), 0.005), name
        assert watchers[name].value("lagwatch_replica_streaming", replica="replica2") == 0


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
                expected = time.monotonic() - writer.first_write_at
                got = lag(lagwatch, "replica2")
                assert got is not None and abs(got - expected) <= 2 * interval, (got, expected)
            assert got is not None and got >= 4, got
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
    for name in ("lagwatch_wal_bytes_total", "lagwatch_wal_records_total", "lagwatch_wal_inspected_bytes_total"):
        # (pg_walinspect is read every 10 s)
        lagwatch.wait_for(f"{name} to move", lambda name=name: (lagwatch.samples().get((name, _labels())) or 0)
                          > before.get((name, _labels()), 0), timeout=15)
    assert after[("lagwatch_wal_rate_bytes_per_second", _labels())] > 0
    assert after[("lagwatch_wal_directory_bytes", _labels())] > 0
    method = "pglz" if pg_cluster.binaries.major < 15 else pg_cluster.primary.scalar("SHOW wal_compression")
    assert after[("lagwatch_wal_compression_info", _labels(method=method))] == 1
    has_write_counters = ("lagwatch_wal_writes_total", _labels()) in after
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


def _answered(lw: Lagwatch, node: str) -> float:
    """Polls of ``node`` that got an answer: attempts minus failures of every kind."""
    samples = lw.samples()
    errors = sum(v for (name, labels), v in samples.items()
                 if name == "lagwatch_poll_errors_total" and ("node", node) in labels)
    return samples.get(("lagwatch_polls_total", _labels(node=node)), 0) - errors


def _sampled(lw: Lagwatch, replica: str) -> float:
    return lw.value("lagwatch_replica_lag_sampled_seconds_count", replica=replica) or 0


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


@pytest.mark.parametrize("how", ["stopped", "frozen"])
def test_unanswering_node_is_down_alone(pg_cluster: ChaosCluster, watchers: dict[str, Lagwatch], how: str) -> None:
    """A stopped or hung replica is down within two intervals; the other nodes keep their
    cadence at both intervals (the 100 ms watcher: about 10 answered polls a second)."""
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
    went = time.monotonic()
    for name, lw in watchers.items():
        lw.wait_for("replica2 down", lambda lw=lw: lw.value("lagwatch_up", node="replica2") == 0, timeout=10)
        assert time.monotonic() - went <= 2 * INTERVALS["1s"] + 0.5, name
        assert lw.value("lagwatch_up", node="primary") == 1
        assert lw.value("lagwatch_up", node="replica1") == 1
    # The other nodes keep their cadence: about one answered poll, and one staleness sample
    # of replica1, per interval.
    before = {name: {"primary": _answered(lw, "primary"), "replica1": _answered(lw, "replica1"),
                     "samples": _sampled(lw, "replica1")} for name, lw in watchers.items()}
    started = time.monotonic()
    let_time_pass(5.0)  # the cadence is polls per second of wall time: measured over 5 s of it
    elapsed = time.monotonic() - started
    for name, lw in watchers.items():
        after = {"primary": _answered(lw, "primary"), "replica1": _answered(lw, "replica1"),
                 "samples": _sampled(lw, "replica1")}
        expected = elapsed / INTERVALS[name]
        for what in after:
            got = after[what] - before[name][what]
            # ±1 for where the 5 s fall between polls (one more, or one fewer, at either end).
            assert 0.8 * expected - 1 <= got <= 1.2 * expected + 1, (name, what, got, expected)
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
