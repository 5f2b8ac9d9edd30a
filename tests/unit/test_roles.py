"""Roles as observed: a promotion, a split brain, one server under two names (pure, no I/O)."""

from __future__ import annotations

import logging

import pytest
from lagwatch.act.policy import PolicyState, PoolRules, ReplicaHealth, decide
from lagwatch.config import ReplicaSla, parse_config
from lagwatch.estimate.lsnclock import LsnClock
from lagwatch.estimate.snapshot import ClusterSnapshot, NodeObservation
from lagwatch.estimate.tracker import ClusterTracker
from lagwatch.serve.alerting import conditions
from lagwatch.views.replication import WalSender
from lagwatch.views.server import ServerPosition
from lagwatch.views.wal_receiver import WalReceiver

CONFIG = parse_config({"interval": "1s", "window": "1m", "clusters": [{
    "name": "main", "primary": {"dsn": "host=a,b,c target_session_attrs=read-write"},
    "replicas": [{"name": "replica1", "dsn": "host=b"}, {"name": "replica2", "dsn": "host=c"}]}]})


def sender(name: str, lsn: int, replay: int) -> WalSender:
    return WalSender(application_name=name, client_addr=None, state="streaming", sync_state="async", slot_name=name,
                     current_lsn=lsn, sent_lsn=lsn, write_lsn=lsn, flush_lsn=lsn, replay_lsn=replay,
                     write_lag=None, flush_lag=None, replay_lag=None)


def writer(node: str, server: str, at: float, lsn: int, timeline: int,
           senders: tuple[WalSender, ...] = ()) -> NodeObservation:
    return NodeObservation(cluster="main", node=node, role="primary" if node == "primary" else "replica",
                           observed_at=at, duration=0.001, walsenders=senders,
                           position=ServerPosition(False, lsn, None, None, None, None, timeline=timeline,
                                                   server_id=server))


def follower(node: str, server: str, at: float, replay: int, timeline: int | None) -> NodeObservation:
    receiver = WalReceiver("streaming", timeline=timeline) if timeline is not None else WalReceiver(None)
    return NodeObservation(cluster="main", node=node, role="replica", observed_at=at, duration=0.001,
                           position=ServerPosition(True, None, replay, replay, "not paused", None, server_id=server),
                           receiver=receiver)


def down(node: str, at: float) -> NodeObservation:
    return NodeObservation(cluster="main", node=node, role="primary" if node == "primary" else "replica",
                           observed_at=at, duration=0.5, error_kind="connect", error="refused")


def role_of(snap: ClusterSnapshot, node: str) -> str:
    return next(n.observed_role for n in snap.nodes if n.name == node)


def replica(snap: ClusterSnapshot, name: str):  # type: ignore[no-untyped-def]
    return next(r for r in snap.replicas if r.name == name)


def test_failover_follows_the_new_primary_and_a_replica_left_behind_reads_growing_lag() -> None:
    tracker = ClusterTracker(CONFIG.clusters[0], 1.0, 60.0)
    # t=0..9: A writes 100 bytes a second; replica2 keeps up, replica1 stops at 1500 (t=5).
    for t in range(10):
        lsn = 1000 + 100 * t
        r1 = min(lsn, 1500)
        snap = tracker.update([writer("primary", "A", t, lsn, 1, (sender("replica1", lsn, r1),
                                                                    sender("replica2", lsn, lsn))),
                               follower("replica1", "B", t, r1, 1), follower("replica2", "C", t, lsn, 1)], now=t)
    assert snap.primaries == 1 and snap.primary_node == "primary" and snap.timeline == 1
    # t=10: A stops.
    snap = tracker.update([down("primary", 10), follower("replica1", "B", 10, 1500, None),
                           follower("replica2", "C", 10, 1900, None)], now=10)
    assert snap.primaries == 0 and role_of(snap, "primary") == "unknown"
    # t=11..20: replica1 promoted (timeline 2, writing from 1500 on); the multi-host DSN
    # finds it too. replica2 stays where it is, on timeline 1: its 1501..1900 is A's WAL,
    # which the new primary never had.
    for t in range(11, 21):
        lsn = 1500 + 100 * (t - 10)
        snap = tracker.update([writer("primary", "B", t, lsn, 2), writer("replica1", "B", t, lsn, 2),
                               follower("replica2", "C", t, 1900, None)], now=t)
        assert snap.primaries == 1, t  # one server under two names
        r2 = replica(snap, "replica2")
        # B wrote its first bytes after the promotion (t=10..11): replica2 lacks them all,
        # and that grows by a second a second. Never "caught up" while B is short of 1900.
        assert r2.follows_primary is False and r2.staleness == t - 11, (t, r2.staleness)
    assert role_of(snap, "replica1") == "primary" and snap.timeline == 2
    assert snap.role_changes_total == 1
    assert [r.name for r in snap.replicas] == ["replica2"]  # replica1 is no lagging replica
    # t=21..25: replica2 re-pointed at B (rewound), streams and catches up.
    for t in range(21, 26):
        lsn = 1500 + 100 * (t - 10)
        snap = tracker.update([writer("primary", "B", t, lsn, 2, (sender("replica2", lsn, lsn),)),
                               writer("replica1", "B", t, lsn, 2), follower("replica2", "C", t, lsn, 2)], now=t)
    r2 = replica(snap, "replica2")
    assert r2.follows_primary is True and r2.staleness == 0.0
    assert snap.role_changes_total == 1
    # t=26..27: its WAL receiver restarts (no walsender, no timeline for a moment): it
    # followed since the promotion, so it is not held back to the fork (no false hours).
    for t in range(26, 28):
        lsn = 1500 + 100 * (t - 10)
        snap = tracker.update([writer("primary", "B", t, lsn, 2), writer("replica1", "B", t, lsn, 2),
                               follower("replica2", "C", t, lsn, None)], now=t)
    r2 = replica(snap, "replica2")
    assert r2.follows_primary is False and r2.staleness == 0.0


def test_two_servers_accepting_writes_are_a_split_brain_and_the_configured_dsn_keeps_the_clock() -> None:
    tracker = ClusterTracker(CONFIG.clusters[0], 1.0, 60.0)
    for t in range(5):
        lsn = 1000 + 100 * t
        snap = tracker.update([writer("primary", "A", t, lsn, 1, (sender("replica2", lsn, lsn),)),
                               writer("replica1", "B", t, 900 + 10 * t, 2), follower("replica2", "C", t, lsn, 1)],
                              now=t)
    assert snap.primaries == 2
    assert snap.primary_node == "primary" and snap.timeline == 1
    assert role_of(snap, "replica1") == "primary"
    assert replica(snap, "replica2").staleness == 0.0 and replica(snap, "replica2").follows_primary is True


def test_a_down_node_keeps_its_last_role_and_a_demoted_one_counts_as_a_change() -> None:
    tracker = ClusterTracker(CONFIG.clusters[0], 1.0, 60.0)
    tracker.update([writer("primary", "A", 0, 1000, 1), follower("replica1", "B", 0, 1000, 1)], now=0)
    tracker.update([writer("primary", "A", 1, 1000, 1), down("replica1", 1)], now=1)
    snap = tracker.update([writer("primary", "A", 2, 1000, 1), follower("replica1", "B", 2, 1000, 1)], now=2)
    assert snap.role_changes_total == 0  # down and back as a replica: no change
    snap = tracker.update([writer("primary", "A", 3, 1000, 1), writer("replica1", "B", 3, 1000, 2)], now=3)
    snap = tracker.update([writer("primary", "A", 4, 1000, 1), follower("replica1", "B", 4, 1000, 1)], now=4)
    assert snap.role_changes_total == 2


def test_the_lsn_clock_keeps_shared_history_when_the_new_primary_is_behind() -> None:
    clock = LsnClock(64)
    for t, lsn in enumerate((100, 200, 300, 400)):
        clock.record(lsn, float(t))
    clock.truncate(250)
    assert clock.latest_lsn == 200
    clock.record(260, 10.0)
    # A replica at 150 lacks 200's bytes, first seen at t=1: 11 s at t=12, no spike.
    assert clock.age(150, 12.0) == 11.0


def test_a_promoted_replica_leaves_the_pool_at_once_and_is_not_kept_for_min_replicas() -> None:
    sla = ReplicaSla(max_lag=1.0, p95=None, eject_after=3, readmit_below=0.5, readmit_after=3)
    state = PolicyState.from_pool(frozenset({"replica1", "replica2"}), ["replica1", "replica2"], 0.0)
    health = [ReplicaHealth("replica1", None, True, False, promoted=True),
              ReplicaHealth("replica2", 30.0, True, False)]
    decision = decide(health, {"replica1": sla, "replica2": sla}, PoolRules(min_replicas=1, fallback_to_primary=False),
                      state, {}, now=1.0)
    assert "replica1" not in decision.pool
    assert decision.reasons["replica1"] == "promoted: it accepts writes now"
    assert decision.pool == {"replica2"}  # kept for min_replicas: the replica, not the new primary


STANDBY = parse_config({"interval": "1s", "window": "1m", "clusters": [{
    "name": "dr", "standby_cluster": True, "primary": {"dsn": "host=s1"},
    "replicas": [{"name": "s1", "dsn": "host=s1"}, {"name": "s2", "dsn": "host=s2"}]}]})


def standby_member(node: str, server: str, at: float, received: int, replay: int, timeline: int = 1) -> NodeObservation:
    return NodeObservation(cluster="dr", node=node, role="primary" if node == "primary" else "replica",
                           observed_at=at, duration=0.001, receiver=WalReceiver("streaming", timeline=timeline),
                           position=ServerPosition(True, None, received, replay, "not paused", None, server_id=server))


def test_a_standby_cluster_is_measured_against_its_standby_leader() -> None:
    """A standby cluster: the primary DSN reaches s1, in recovery, streaming from a primary
    outside the cluster; s2 cascades from it. s1 is the standby leader (not a lagging
    replica of nothing), the cluster has no writer and no 'no primary' condition, and s2's
    staleness is dated by what s1 has received: 0 while it keeps up, growing a second a
    second while its replay stands still."""
    tracker = ClusterTracker(STANDBY.clusters[0], 1.0, 60.0)
    for t in range(5):
        lsn = 1000 + 100 * t
        snap = tracker.update([standby_member("primary", "S1", t, lsn, lsn), standby_member("s1", "S1", t, lsn, lsn),
                               standby_member("s2", "S2", t, lsn, lsn)], now=t)
    assert snap.primaries == 0 and snap.primary_node == "primary" and snap.timeline == 1
    assert [role_of(snap, n) for n in ("primary", "s1", "s2")] == ["standby_leader", "standby_leader", "replica"]
    assert replica(snap, "s2").staleness == 0.0 and replica(snap, "s2").follows_primary is True
    assert replica(snap, "s1").staleness == 0.0  # the standby leader serves reads too
    assert snap.sync is None and snap.role_changes_total == 0
    assert [a.alert for a in conditions(snap)] == []
    for t in range(5, 10):  # s2's replay stands at 1400 while s1 receives on
        lsn = 1000 + 100 * t
        snap = tracker.update([standby_member("primary", "S1", t, lsn, lsn), standby_member("s1", "S1", t, lsn, lsn),
                               standby_member("s2", "S2", t, lsn, 1400)], now=t)
        assert replica(snap, "s2").staleness == t - 5, (t, replica(snap, "s2").staleness)
    # The same servers watched as an ordinary cluster: no writer, and that is a page.
    plain = ClusterTracker(STANDBY.clusters[0].model_copy(update={"standby_cluster": False}), 1.0, 60.0)
    snap = plain.update([standby_member("primary", "S1", 0, 1000, 1000), standby_member("s1", "S1", 0, 1000, 1000),
                         standby_member("s2", "S2", 0, 1000, 1000)], now=0)
    assert role_of(snap, "primary") == "replica"
    assert [a.alert for a in conditions(snap)] == ["LagwatchNoPrimary"]


def test_a_replica_with_the_promoted_ones_server_id_is_not_named_with_it_nor_dates_the_fork(
        caplog: pytest.LogCaptureFixture) -> None:
    """CI once saw two replicas started together report one server_id (postmaster start time
    and port): the promoted one's names are the writers on it, and the fork is where the
    promoted node itself had replayed, not where the other replica had."""
    tracker = ClusterTracker(CONFIG.clusters[0], 1.0, 60.0)
    for t in range(5):
        lsn = 1000 + 100 * t
        tracker.update([writer("primary", "A", t, lsn, 1), follower("replica1", "B", t, min(lsn, 1200), 1),
                        follower("replica2", "B", t, lsn, 1)], now=t)
    tracker.update([down("primary", 5), follower("replica1", "B", 5, 1200, None),
                    follower("replica2", "B", 5, 1400, None)], now=5)
    with caplog.at_level(logging.INFO, logger="lagwatch.estimate.roles"):
        snap = tracker.update([writer("primary", "B", 6, 1300, 2), writer("replica1", "B", 6, 1300, 2),
                               follower("replica2", "B", 6, 1400, None)], now=6)
    assert "the primary is now another server (primary = replica1), on timeline 2" in caplog.text
    assert "replayed up to 0/4B0 at most" in caplog.text  # 1200, replica1's; not replica2's 1400
    assert snap.primaries == 1 and role_of(snap, "replica2") == "replica"
