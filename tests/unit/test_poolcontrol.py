"""PoolController's own logic, with a stub pooler and a stub leader lock (no servers).

The real adapters and the real advisory lock are tested against real PgBouncer, HAProxy and
PostgreSQL in tests/integration; here: what the controller does with what they return.
Leadership and holds come in as arguments each cycle (the daemon looks them up).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from lagwatch.act.holds import HoldsError, HoldStore
from lagwatch.act.leader import Standing
from lagwatch.act.poolcontrol import PoolController
from lagwatch.config import ClusterConfig, parse_config
from lagwatch.estimate.snapshot import ClusterSnapshot, LockHolder, NodeObservation
from lagwatch.estimate.tracker import ClusterTracker
from lagwatch.poolers.base import PoolerError
from lagwatch.views.replication import WalSender
from lagwatch.views.server import ServerPosition
from lagwatch.views.wal_receiver import WalReceiver

SLA = {"max_lag": "2s", "eject_after": 2, "readmit_below": "1s", "readmit_after": 2, "min_replicas": 0}


def cluster_config(tmp_path: Path, dry_run: bool = False) -> ClusterConfig:
    return parse_config({"interval": "1s", "clusters": [{
        "name": "main", "primary": {"dsn": "host=p"}, "dry_run": dry_run, "sla": SLA,
        "replicas": [{"name": "replica1", "dsn": "host=r1"}, {"name": "replica2", "dsn": "host=r2"}],
        "pooler": {"kind": "command", "template": "{hosts}\n", "output_file": str(tmp_path / "pool.txt"),
                   "reload_command": ["true"]}}]}).clusters[0]


class StubPooler:
    kind = "stub"
    read_back_every = 0.0  # read back every cycle: what each test does to it is seen at once

    def __init__(self, pool: set[str]) -> None:
        self.pool = frozenset(pool)
        self.read_error: BaseException | None = None
        self.apply_error: BaseException | None = None
        self.applied: list[frozenset[str]] = []

    def read_pool(self) -> frozenset[str]:
        if self.read_error is not None:
            raise self.read_error
        return self.pool

    def apply_pool(self, members: frozenset[str]) -> None:
        if self.apply_error is not None:
            raise self.apply_error
        self.applied.append(members)
        self.pool = members

    def routes_for(self, members: frozenset[str], current: frozenset[str] | None) -> frozenset[str]:
        return members


class StubLeader:
    """What leader.Leadership would say of the cluster: this instance leads unless
    ``holder`` (another session) holds the lock."""

    def __init__(self) -> None:
        self.holder: LockHolder | None = None  # None: this instance may take the lock
        self.ours = LockHolder(101, "lagwatch-leader", "lagwatch", "", True)

    def standing(self) -> Standing:
        if self.holder is None or self.holder.is_us:
            return Standing(True, self.ours)
        return Standing(False, self.holder)


def step(h: Harness, snapshot: ClusterSnapshot, t: float) -> Any:
    holds: Any
    try:
        holds = h.holds.current()
    except HoldsError as exc:
        holds = exc
    return asyncio.run(h.controller.step(snapshot, t, h.leader.standing(), holds))


def observations(t: float, lag1: int) -> list[NodeObservation]:
    """The primary writes 1000 bytes a second; replica2 is caught up; replica1 is ``lag1``
    seconds of WAL behind (as far as the history goes back)."""
    lsn = int(1000 * (t + 1))

    def replica(name: str, replay: int) -> NodeObservation:
        return NodeObservation(cluster="main", node=name, role="replica", observed_at=t, duration=0.001,
                               position=ServerPosition(True, None, replay, replay, "not paused", 1.0),
                               receiver=WalReceiver("streaming"))

    def sender(name: str, replay: int) -> WalSender:
        return WalSender(application_name=name, client_addr=None, state="streaming", sync_state="async",
                         slot_name=name, current_lsn=lsn, sent_lsn=lsn, write_lsn=lsn, flush_lsn=lsn,
                         replay_lsn=replay, write_lag=None, flush_lag=None, replay_lag=None)

    replays = {"replica1": max(1000, lsn - 1000 * lag1), "replica2": lsn}
    return [NodeObservation(cluster="main", node="primary", role="primary", observed_at=t, duration=0.001,
                            position=ServerPosition(False, lsn, None, None, None, None),
                            walsenders=tuple(sender(n, r) for n, r in replays.items())),
            *(replica(n, r) for n, r in replays.items())]


class Harness:
    def __init__(self, tmp_path: Path, pool: set[str], dry_run: bool = False) -> None:
        config = cluster_config(tmp_path, dry_run)
        self.holds = HoldStore(tmp_path / "holds.json")
        self.controller = PoolController(config, 1.0, 1.0)
        self.pooler = StubPooler(pool)
        self.leader = StubLeader()
        self.controller.pooler = self.pooler  # type: ignore[assignment]
        self.tracker = ClusterTracker(config, 1.0, 60.0)
        self.t = 0.0

    def cycle(self, lag1: int = 0) -> ClusterSnapshot:
        self.t += 1
        snapshot = self.tracker.update(observations(self.t, lag1), self.t)
        status = step(self, snapshot, self.t)
        return ClusterSnapshot(**{**snapshot.__dict__, "pool": status})


def test_unexpected_adapter_errors_are_contained_counted_and_retried(tmp_path: Path) -> None:
    h = Harness(tmp_path, {"replica1", "replica2"})
    h.cycle()
    h.pooler.read_error = PermissionError(13, "Permission denied", "/etc/pgbouncer/admin.pw")
    snap = h.cycle()
    assert snap.pool is not None and snap.pool.read_errors_total == 1
    assert "Permission denied" in (snap.pool.last_error or "")
    h.pooler.read_error = None
    h.pooler.apply_error = KeyError("a bug")
    for _ in range(6):
        snap = h.cycle(lag1=10)  # replica1 breaks max_lag: ejected after 2 cycles, the apply fails
        if snap.pool is not None and snap.pool.apply_errors_total:
            break
    assert snap.pool is not None and snap.pool.apply_errors_total == 1
    assert snap.pool.changes_total == {("replica1", "eject"): 1}
    assert "internal error: KeyError" in (snap.pool.last_error or "")
    assert h.pooler.applied == []


def test_pooler_answering_again_applies_without_waiting_out_the_backoff(tmp_path: Path) -> None:
    h = Harness(tmp_path, {"replica1", "replica2"})
    h.cycle()
    h.pooler.read_error = PoolerError("admin console down")
    h.pooler.apply_error = PoolerError("admin console down")
    for _ in range(6):
        snap = h.cycle(lag1=10)
    assert snap.pool is not None and snap.pool.apply_errors_total >= 1
    h.pooler.read_error = h.pooler.apply_error = None
    h.cycle(lag1=10)
    assert h.pooler.applied == [frozenset({"replica2"})]


def test_corrupt_holds_file_keeps_the_holds_last_read(tmp_path: Path) -> None:
    h = Harness(tmp_path, {"replica1", "replica2"})
    h.holds.set("main", "replica1", "out")
    snap = h.cycle()
    assert h.pooler.pool == frozenset({"replica2"})
    (tmp_path / "holds.json").write_text('{"main": {"replica1": "ou')  # an editor mid-write
    for _ in range(5):
        snap = h.cycle()
    assert h.pooler.pool == frozenset({"replica2"}), "a held-out replica was readmitted"
    assert snap.pool is not None and snap.pool.holds == {"replica1": "out"}
    assert "keeping the holds last read" in (snap.pool.last_error or "")
    (tmp_path / "holds.json").write_text(json.dumps({}))
    for _ in range(3):
        h.cycle()
    assert h.pooler.pool == frozenset({"replica1", "replica2"})


@pytest.mark.parametrize("dry_run", [True, False])
def test_dry_run_never_leads_nor_applies(tmp_path: Path, dry_run: bool) -> None:
    from lagwatch.runtime import claims

    h = Harness(tmp_path, {"replica1", "replica2"}, dry_run=dry_run)
    for _ in range(6):
        snap = h.cycle(lag1=10)
    assert snap.pool is not None and snap.pool.changes_total == {("replica1", "eject"): 1}
    # A dry run's lock is not even asked for: a trial instance must not keep the real one from applying.
    config = parse_config({"interval": "1s", "state_dir": str(tmp_path), "clusters": [{
        "name": "main", "primary": {"dsn": "host=p"}, "dry_run": dry_run, "sla": SLA,
        "replicas": [{"name": "replica1", "dsn": "host=r1"}],
        "pooler": {"kind": "command", "template": "{hosts}\n", "output_file": str(tmp_path / "pool.txt"),
                   "reload_command": ["true"]}}]})
    claimed = set(claims(config))
    if dry_run:
        assert claimed == set() and not snap.pool.leader  # though the stub leader says it leads
        assert h.pooler.applied == []
    else:
        assert claimed == {"main"} and snap.pool.leader
        assert h.pooler.applied == [frozenset({"replica2"})]


def test_a_decision_a_stranger_keeps_from_being_applied_is_logged_as_not_applied(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from lagwatch.estimate.snapshot import Snapshot
    from lagwatch.serve.export import SnapshotCollector

    h = Harness(tmp_path, {"replica1", "replica2"})
    h.leader.holder = LockHolder(4242, "psql", "mallory", "127.0.0.9", False)
    for _ in range(6):
        snap = h.cycle(lag1=10)
    assert snap.pool is not None and not snap.pool.leader and h.pooler.applied == []
    lines = [r.getMessage() for r in caplog.records if "pool change" in r.getMessage()]
    assert lines and all("(NOT APPLIED: the leader lock is held by a session that is not lagwatch: pid 4242, "
                         "application_name 'psql', user 'mallory', from 127.0.0.9)" in line for line in lines), lines
    families = {f.name: f for f in SnapshotCollector(lambda: Snapshot(0.0, 1.0, 1, 0, (snap,))).collect()}
    [sample] = families["lagwatch_leader_holder_info"].samples
    assert sample.labels == {"cluster": "main", "pid": "4242", "application_name": "psql", "user": "mallory",
                             "lagwatch": "false"} and sample.value == 1.0
    h.leader.holder = None  # the stranger lets go: this instance leads and applies at once
    h.cycle(lag1=10)
    assert h.pooler.applied == [frozenset({"replica2"})]


def test_removed_fallback_primary_reads_zero_not_absent(tmp_path: Path) -> None:
    from lagwatch.estimate.snapshot import Snapshot
    from lagwatch.serve.export import SnapshotCollector
    from prometheus_client import CollectorRegistry

    h = Harness(tmp_path, {"replica1", "replica2"})
    snap = h.cycle()
    status = snap.pool
    assert status is not None
    status = type(status)(**{**status.__dict__, "changes_total": {("primary", "add"): 1, ("primary", "remove"): 1}})
    snap = ClusterSnapshot(**{**snap.__dict__, "pool": status})
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: Snapshot(1.0, 0.01, 1, 0, (snap,))))
    assert registry.get_sample_value("lagwatch_pool_member", {"cluster": "main", "replica": "primary"}) == 0.0


def test_the_fallback_primary_is_whichever_node_accepts_writes_now(tmp_path: Path) -> None:
    """The configured primary is down and replica1 was promoted; replica2 is far behind and
    out: the fallback routes reads to replica1's address (the primary now), not to the
    configured primary's."""
    config = parse_config({"interval": "1s", "clusters": [{
        "name": "main", "primary": {"dsn": "host=p"},
        "sla": {**SLA, "min_replicas": 1, "fallback_to_primary": True},
        "replicas": [{"name": "replica1", "dsn": "host=r1"}, {"name": "replica2", "dsn": "host=r2"}],
        "pooler": {"kind": "command", "template": "{hosts}\n", "output_file": str(tmp_path / "pool.txt"),
                   "reload_command": ["true"]}}]}).clusters[0]
    h = Harness(tmp_path, {"replica1", "replica2"})
    h.controller = PoolController(config, 1.0, 1.0)
    h.controller.pooler = h.pooler  # type: ignore[assignment]
    h.tracker = ClusterTracker(config, 1.0, 60.0)
    for t in range(1, 4):  # healthy
        snap = h.tracker.update(observations(t, 0), t)
        step(h, snap, t)
    for t in range(4, 10):  # the primary gone, replica1 promoted, replica2 stuck at 3000
        lsn = 4000 + 1000 * (t - 4)
        obs = [NodeObservation(cluster="main", node="primary", role="primary", observed_at=t, duration=0.5,
                               error_kind="connect", error="refused"),
               NodeObservation(cluster="main", node="replica1", role="replica", observed_at=t, duration=0.001,
                               position=ServerPosition(False, lsn, None, None, None, None, timeline=2,
                                                       server_id="r1")),
               NodeObservation(cluster="main", node="replica2", role="replica", observed_at=t, duration=0.001,
                               position=ServerPosition(True, None, 3000, 3000, "not paused", 1.0),
                               receiver=WalReceiver(None))]
        snap = h.tracker.update(obs, t)
        status = step(h, snap, t)
    assert snap.primary_node == "replica1"
    assert status.members == {"primary"}, status.reasons
    assert h.pooler.applied[-1] == {"replica1"}
    assert status.reasons["replica1"] == "promoted: it accepts writes now"


def test_a_discovered_clusters_fallback_routes_to_the_leader_member(tmp_path: Path) -> None:
    """With discovery the writer DSN lists every member (no one address): the fallback
    routes to the member on the server that accepts writes now, m2 here; with no member
    known to be that server, it routes nowhere rather than to the multi-host DSN."""
    from lagwatch.sources.patroni import cluster_config as discovered
    from lagwatch.sources.patroni import parse_cluster

    (patroni,) = parse_config({"interval": "1s", "clusters": [{
        "name": "main", "discovery": {"kind": "patroni", "urls": ["http://x:8008"]},
        "members": {"dsn": "user=lagwatch"}, "sla": {**SLA, "min_replicas": 1, "fallback_to_primary": True},
        "pooler": {"kind": "command", "template": "{hosts}\n", "output_file": str(tmp_path / "pool.txt"),
                   "reload_command": ["true"]}}]}).patroni_clusters
    config = discovered(patroni, parse_cluster({"members": [
        {"name": n, "role": "replica", "host": f"10.0.0.{i}", "port": 5432} for i, n in ((1, "m1"), (2, "m2"))]}, "u"))
    h = Harness(tmp_path, {"m1"})
    h.controller = PoolController(config, 1.0, 1.0)
    h.controller.pooler = h.pooler  # type: ignore[assignment]
    h.tracker = ClusterTracker(config, 1.0, 60.0)

    def cycle(t: int, m2_answers: bool = True) -> Any:
        lsn = 10_000 + 1000 * t
        leader = ServerPosition(False, lsn, None, None, None, None, timeline=2, server_id="s2")
        obs = [NodeObservation(cluster="main", node="primary", role="primary", observed_at=t, duration=0.001,
                               position=leader),
               NodeObservation(cluster="main", node="m1", role="replica", observed_at=t, duration=0.001,
                               position=ServerPosition(True, None, 3000, 3000, "not paused", 1.0, server_id="s1"),
                               receiver=WalReceiver(None)),
               NodeObservation(cluster="main", node="m2", role="replica", observed_at=t, duration=0.001,
                               position=leader) if m2_answers else
               NodeObservation(cluster="main", node="m2", role="replica", observed_at=t, duration=0.5,
                               error_kind="connect", error="timeout")]
        snap = h.tracker.update(obs, t)
        return snap, step(h, snap, t)

    for t in range(1, 8):  # m1 stuck far behind, m2 leads
        snap, status = cycle(t)
    assert (snap.primary_node, snap.writer_member) == ("primary", "m2")
    assert status.members == {"primary"}, status.reasons
    assert h.pooler.applied[-1] == {"m2"}
    applied = len(h.pooler.applied)
    snap, status = cycle(8, m2_answers=False)  # the leader answers only through the writer DSN
    assert snap.writer_member is None
    assert h.pooler.pool == {"m2"} and len(h.pooler.applied) == applied  # left as it is, never the writer DSN


def test_a_new_leader_reads_the_pool_back_before_it_decides_what_to_apply(tmp_path: Path) -> None:
    """While another instance led, it changed the pooler; this one's last read of it is
    stale. Become the leader, and it reads the pooler first: it applies what the pooler
    lacks rather than trusting the old view (test_pool_pgbouncer's two instances saw that)."""
    h = Harness(tmp_path, {"replica1", "replica2"})
    h.pooler.read_back_every = 1e9  # type: ignore[misc]  # no periodic read in this test
    h.leader.holder = LockHolder(4242, "lagwatch-leader", "lagwatch", "10.0.0.9", False)  # the other instance
    for _ in range(3):
        snap = h.cycle()
    assert snap.pool is not None and not snap.pool.leader and snap.pool.pooler_members == {"replica1", "replica2"}
    h.pooler.pool = frozenset({"replica2"})  # the other instance ejected replica1, then died
    h.leader.holder = None
    snap = h.cycle()
    assert snap.pool is not None and snap.pool.leader
    assert h.pooler.applied == [frozenset({"replica1", "replica2"})]
