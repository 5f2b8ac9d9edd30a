"""Why a replica is behind, each cause made for real on real servers, and what the page,
the API and the metrics then say (diagnosis.py, views/recovery.py, replayload.py).

- an apply delay, a paused replay, a lock conflict with a session on the replica (its pid
  named; the cancelled query counted by type against the replica's own counters), WAL held
  on its way (a relay that stops passing bytes: sent, not written), a replica cut off;
- the stages add up to the headline in every reading;
- the replay busy ratio against the share the test itself samples from the startup
  process, many times a cycle, while a write load keeps replay working, and idle.

Both versions: what is read differs (pg_stat_io and a sixth conflict type from 16).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from chaoscluster import ChaosCluster
from harness import Lagwatch, Writer, cluster_config, let_time_pass
from lagwatch.demo.ports import free_port
from throttled_link import ThrottledLink

INTERVAL = "100ms"
WINDOW_SECONDS = 6.0


@pytest.fixture(scope="module")
def lagwatch(pg_cluster: ChaosCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lagwatch]:
    folder = tmp_path_factory.mktemp("why")
    config = cluster_config(pg_cluster, free_port(["127.0.0.1"]), interval=INTERVAL, window=f"{WINDOW_SECONDS:g}s",
                            state_dir=str(folder / "state"))
    with Lagwatch(folder, config) as lw:
        lw.wait_ready()
        yield lw


def replica_status(lw: Lagwatch, name: str = "replica1") -> dict[str, Any]:
    return next(r for r in lw.status()["clusters"][0]["replicas"] if r["name"] == name)


def why(lw: Lagwatch, name: str = "replica1") -> dict[str, Any]:
    return replica_status(lw, name)["why"] or {}


def wait_cause(lw: Lagwatch, cause: str, timeout: float = 15, name: str = "replica1") -> dict[str, Any]:
    seen: list[dict[str, Any]] = []

    def holds() -> bool:
        seen.append(why(lw, name))
        return seen[-1].get("cause") == cause

    try:
        lw.wait_for(f"{name}'s cause {cause}", holds, timeout)
    except AssertionError:
        raise AssertionError(f"{name}'s cause never {cause}; last: {seen[-1] if seen else None}") from None
    return seen[-1]


def steady_causes(lw: Lagwatch, seconds: float, name: str = "replica1") -> list[tuple[str, dict[str, Any]]]:
    """The cause in each distinct reading over ``seconds``, checking that the stages add up."""
    out: dict[float, tuple[str, dict[str, Any]]] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        r = replica_status(lw, name)
        w = r["why"] or {}
        if r["staleness_seconds"] is not None and w.get("stages_seconds"):
            # The stages add up to the headline in every reading.
            assert sum(w["stages_seconds"].values()) == pytest.approx(r["staleness_seconds"], abs=1e-6), (r, w)
            out[r["staleness_measured_at_monotonic"]] = (w["cause"], w)
        time.sleep(0.05)
    return list(out.values())


def test_an_apply_delay_and_a_pause_are_named_and_sit_in_replay(pg_cluster: ChaosCluster, lagwatch: Lagwatch) -> None:
    lw, r1 = lagwatch, pg_cluster.replicas[0]
    with Writer(pg_cluster, every=0.02, max_seconds=60):
        r1.set_apply_delay(0.3)
        wait_cause(lw, "apply_delay")
        readings = steady_causes(lw, 2.0)
        share = sum(1 for cause, _ in readings if cause == "apply_delay") / len(readings)
        assert share >= 0.9, readings
        w = why(lw)
        assert "recovery_min_apply_delay" in w["detail"] and "300ms" in w["detail"], w
        # Where a 300 ms delay holds the lag: on the replica's disk, not replayed.
        assert w["stages_seconds"]["replay"] >= 0.8 * sum(w["stages_seconds"].values()), w
        assert lw.value("lagwatch_replica_lag_cause", cause="apply_delay", replica="replica1") == 1
        assert lw.value("lagwatch_replica_lag_cause", cause="caught_up", replica="replica1") == 0
        r1.set_apply_delay(0)

        r1.pause_replay()
        w = wait_cause(lw, "replay_paused")
        assert "pg_wal_replay_resume()" in w["detail"]
        assert w["startup_process"]["activity"] == "paused", w
        for cause, w in steady_causes(lw, 1.0):
            assert cause == "replay_paused"
            assert w["stages_seconds"]["replay"] == pytest.approx(sum(w["stages_seconds"].values()), rel=0.05), w
        r1.resume_replay()
    wait_cause(lw, "caught_up")
    # Replica2 (no delay, no pause) was never held in replay.
    assert why(lw, "replica2")["cause"] in ("caught_up", "sender", "network", "replay_busy")


def test_a_lock_conflict_names_the_session_and_its_cancellation_is_counted(pg_cluster: ChaosCluster,
                                                                           lagwatch: Lagwatch) -> None:
    lw, primary, r1 = lagwatch, pg_cluster.primary, pg_cluster.replicas[0]
    primary.execute("CREATE TABLE IF NOT EXISTS lw_conflict (id int)")
    primary.execute("INSERT INTO lw_conflict VALUES (1)")
    r1.alter_system("max_standby_streaming_delay", "4s")
    r1.reload()
    lw.wait_for("the table on replica1", lambda: r1.scalar("SELECT to_regclass('lw_conflict') IS NOT NULL"), 10)
    before = int(r1.scalar("SELECT sum(confl_lock) FROM pg_stat_database_conflicts"))
    with psycopg.connect(r1.dsn()) as holder, Writer(pg_cluster, every=0.05, max_seconds=60):
        holder.execute("SELECT count(*) FROM lw_conflict")  # a transaction holding the table's lock, left open
        holder_pid = holder.info.backend_pid
        primary.execute("BEGIN; LOCK TABLE lw_conflict IN ACCESS EXCLUSIVE MODE; COMMIT")
        w = wait_cause(lw, "recovery_conflict", timeout=4)
        assert w["conflict"] == "lock", w
        assert [h["pid"] for h in w["holders"]] == [holder_pid], w
        assert w["holders"][0]["holds_the_lock"] and w["holders"][0]["user"] == "postgres", w
        assert "query" not in w["holders"][0]  # never the query text
        assert f"pid {holder_pid}" in w["detail"] and "max_standby_streaming_delay 4s" in w["detail"], w
        assert lw.value("lagwatch_replica_recovery_conflict_sessions", replica="replica1") == 1
        # The staleness grows while replay waits (the writer goes on).
        first = replica_status(lw)["staleness_seconds"]
        let_time_pass(1.0)
        assert replica_status(lw)["staleness_seconds"] >= first + 0.5
        # After max_standby_streaming_delay the replica ends the session and replays on.
        wait_cause(lw, "caught_up", timeout=15)
        with pytest.raises(psycopg.OperationalError, match="conflict with recovery"):
            holder.execute("SELECT 1")
    truth = int(r1.scalar("SELECT sum(confl_lock) FROM pg_stat_database_conflicts"))
    assert truth == before + 1
    lw.expect("lagwatch_replica_recovery_conflicts_total", truth, timeout=5, replica="replica1", type="lock")
    assert lw.value("lagwatch_replica_recovery_conflict_sessions", replica="replica1") == 0


def test_wal_held_on_its_way_is_the_network_and_a_cut_replica_is_not_streaming(pg_cluster: ChaosCluster,
                                                                               lagwatch: Lagwatch) -> None:
    lw, primary, r1 = lagwatch, pg_cluster.primary, pg_cluster.replicas[0]
    with ThrottledLink(primary.host, primary.port) as link, Writer(pg_cluster, every=0.05, max_seconds=60):
        r1.set_primary_conninfo(f"host={link.host} port={link.port} user=postgres "
                                f"application_name={r1.application_name}")
        lw.wait_for("replica1 streaming through the link", r1.is_streaming, 20)
        wait_cause(lw, "caught_up", timeout=10)
        link.set_rate(0)  # held: the primary's walsender sends into the socket, nothing arrives
        w = wait_cause(lw, "network", timeout=10)
        assert w["stages_bytes"]["write"] > 0, w
        let_time_pass(1.0)
        w = why(lw)
        assert w["cause"] == "network" and w["stages_seconds"]["write"] >= 0.5 * sum(w["stages_seconds"].values()), w
        link.set_rate(None)
        wait_cause(lw, "caught_up", timeout=15)
    r1.cut_off()
    with Writer(pg_cluster, every=0.05, max_seconds=30):
        w = wait_cause(lw, "not_streaming", timeout=10)
        assert "primary_conninfo" in w["detail"], w
    r1.reconnect(wait=True)


class StartupSampler(threading.Thread):
    """The oracle for the busy ratio: samples the replica's startup process from its own
    connection every few milliseconds (lagwatch samples it once a cycle)."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.samples = dsn, []  # (monotonic time, working)
        self.stopped = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            pid = conn.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'startup'").fetchone()[0]
            while not self.stopped.is_set():
                event = conn.execute("SELECT wait_event FROM pg_stat_get_activity(%s)", (pid,)).fetchone()
                working = event is not None and event[0] not in (
                    "RecoveryWalStream", "RecoveryApplyDelay", "RecoveryPause")
                self.samples.append((time.monotonic(), working))
                self.stopped.wait(0.003)

    def share(self, start: float, end: float) -> float:
        seen = [w for t, w in self.samples if start <= t <= end]
        return sum(seen) / len(seen)


def test_the_replay_busy_ratio_matches_the_startup_process_sampled_closely(pg_cluster: ChaosCluster,
                                                                         lagwatch: Lagwatch) -> None:
    lw, primary, r1 = lagwatch, pg_cluster.primary, pg_cluster.replicas[0]
    for i in range(2):
        primary.execute(f"CREATE TABLE IF NOT EXISTS lw_busy_{i} (id bigint, v text)")
    let_time_pass(WINDOW_SECONDS + 0.5)  # a whole window of an idle primary
    idle = why(lw)
    assert idle["replay_busy_ratio"] is not None and idle["replay_busy_ratio"] <= 0.05, idle
    stop = threading.Event()

    def load(table: str) -> None:  # WAL as fast as two sessions write it: replay, one process, works
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            deadline = time.monotonic() + 30
            while not stop.is_set() and time.monotonic() < deadline:
                conn.execute(f"INSERT INTO {table} SELECT g, md5(g::text) FROM generate_series(1, 5000) g")
                conn.execute(f"DELETE FROM {table}")

    sampler = StartupSampler(r1.dsn())
    writers = [threading.Thread(target=load, args=(f"lw_busy_{i}",), daemon=True) for i in range(2)]
    sampler.start()
    for t in writers:
        t.start()
    try:
        let_time_pass(WINDOW_SECONDS + 1.0)
        w, at = why(lw), time.monotonic()
    finally:
        stop.set()
        sampler.stopped.set()
        for t in [*writers, sampler]:
            t.join(35)
    truth = sampler.share(at - WINDOW_SECONDS - 0.2, at - 0.2)
    print(f"replay busy ratio {w['replay_busy_ratio']:.2f} ({w['replay_busy_samples']} samples) against the "
          f"startup process sampled {len(sampler.samples)} times: {truth:.2f}")
    # One sample a cycle: ~60 in the window, a standard error of up to ±6.5 points.
    assert abs(w["replay_busy_ratio"] - truth) <= 0.2, (w, truth)
    assert truth >= 0.25, f"the load did not keep replay working ({truth:.2f}): the test proves nothing"
    assert lw.value("lagwatch_replica_replay_busy_ratio", replica="replica1") is not None
    if pg_cluster.primary.binaries.major >= 16:
        assert lw.value("lagwatch_replica_startup_reads_total", replica="replica1") is not None
