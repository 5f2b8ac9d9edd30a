"""Folds each cycle's observations of one cluster into an immutable ClusterSnapshot.

A composition of the parts that keep history between cycles, each bounded and each with
its own tests: who is the primary (roles.RoleTracker, with the fork of a promotion), the
lag history (history.LagHistory: the LSN clock, windows, histograms, the transaction
rate), the rates and forecasts (rates.Forecaster), each node's health and its log lines
(nodehealth.NodeHealthTracker), the WAL inspections added up
(views.walinspect.WalInspectTally), the logical consumers (logical.LogicalConsumers), the
primary's transaction ID clock (xidclock.XidClock), when each replica's answer was true
(readinstant.ReadInstants), and each room's keeper (lagwatch.rooms), given the cycle's view
of the cluster (rooms/base.py's Cycle). No I/O: observations carry their own monotonic timestamps.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from lagwatch.config import ClusterConfig
from lagwatch.estimate.beats import Beats
from lagwatch.estimate.clock import PrimaryClock
from lagwatch.estimate.diagnosis import Diagnosis, Positions, Signals, diagnose
from lagwatch.estimate.history import LagHistory, LagReading, ReplayPosition
from lagwatch.estimate.logical import LogicalConsumers
from lagwatch.estimate.lsnclock import Commits, LsnClock, WalDates
from lagwatch.estimate.nodehealth import NodeHealthTracker
from lagwatch.estimate.rates import CatchUp, Forecaster
from lagwatch.estimate.readinstant import ReadInstants
from lagwatch.estimate.replayload import ConflictTotals, ReplayLoadTracker
from lagwatch.estimate.replicastate import (
    ReplaySide,
    follows_primary,
    replica_signals,
    replica_state,
    replica_streaming,
)
from lagwatch.estimate.roles import RoleTracker, RoleView, describe_change, writer_member
from lagwatch.estimate.snapshot import ClusterSnapshot, NodeObservation, ReplicaState
from lagwatch.estimate.syncrep import SyncReplication, assess
from lagwatch.estimate.xidclock import XidClock
from lagwatch.rooms import ROOMS
from lagwatch.rooms.base import Cycle
from lagwatch.views.replication import WalSender
from lagwatch.views.walinspect import WalInspectTally

log = logging.getLogger("lagwatch.estimate.tracker")


@dataclass(frozen=True)
class _PrimaryView:
    """What this cycle's primary answer says, as the replicas' readings need it."""

    lsn: int | None  # its WAL position (a standby leader's: what it received)
    at: float  # when it answered (or the cycle's end, with no answer)
    senders: Mapping[str, WalSender]  # by application_name
    senders_at: float  # the primary's view of a replica is as of its answer, not the cycle's end
    clock: PrimaryClock | None
    standby: bool  # the primary is a standby cluster's leader
    wal_dates: Mapping[str, WalDates]  # by application_name (commitscan.py)
    next_xid: int | None = None  # its transaction ID clock (xidclock.py)
    true_at: float | None = None  # when its position was true (readinstant.py): the forecasts' rates


_NO_PRIMARY: dict[str, WalSender] = {}


class ForgetsNodes(Protocol):
    """A part of the tracker that keeps something per replica or node: one gone is one
    call (rooms/base.py's keepers answer it too)."""

    def forget(self, node: str) -> None: ...


class ClusterTracker:
    def __init__(self, cluster: ClusterConfig, interval: float, window: float, horizon: float = 60.0) -> None:
        self.cluster = cluster
        self.interval = interval
        self.window = window
        self.horizon = horizon  # of the rates that forecasts divide by (catch-up, slot runway)
        self.history = LagHistory(cluster.name, interval, window)
        self.forecast = Forecaster(horizon)
        self.nodes = NodeHealthTracker(cluster.name)
        self.walinspect = WalInspectTally()
        self.roles = RoleTracker(cluster.name, cluster.standby_cluster)
        self.replay_load = ReplayLoadTracker(window)
        self.xids = XidClock()  # the primary's transaction ID clock: dates what holds the vacuum horizon
        self.conflicts = ConflictTotals()
        self.logical = LogicalConsumers(interval, window)
        self.read_instants = ReadInstants()
        self._sync_error: str | None = None  # the last synchronous_standby_names parse error said
        # The cluster's heartbeat writer's beats (heartbeat.py), where it has one: set when
        # the runtime is put in force.
        self.beats: Callable[[], Beats] | None = None
        self._primary_clock = PrimaryClock()  # the primary's wall clock on lagwatch's (the one converter)
        # When the primary's position was true, for the forecasts' rates (readinstant.py): a
        # rate over answers dated when they arrived is off by how late each one was taken in,
        # which a busy host makes tens of milliseconds (a percent of a 5 s horizon).
        self._primary_instants = ReadInstants()
        self.rooms = {room.name: room.keeper() for room in ROOMS}  # each room's keeper (lagwatch.rooms)
        # Everything kept of a replica, each answering forget(name) once it is gone; and of a
        # node (the rooms' keepers read any node), forgotten only once it is gone from the
        # cluster: a configured replica that now leads is still polled and still counted.
        self._per_replica: tuple[ForgetsNodes, ...] = (
            self.forecast, self.replay_load, self.conflicts, self.read_instants)
        self._per_node: tuple[ForgetsNodes, ...] = (self.nodes, *self.rooms.values())

    @property
    def clock(self) -> LsnClock:
        return self.history.clock

    def update(self, observations: Sequence[NodeObservation], now: float) -> ClusterSnapshot:
        by_node = {o.node: o for o in observations}
        self.roles.standby_cluster = self.cluster.standby_cluster  # a reload or discovery may change it
        roles = self.roles.observe(observations)
        primary = self._primary(roles, now)
        answered = roles.primary if roles.primary is not None and roles.primary.position is not None else None
        beats = self.beats() if self.beats is not None else None
        replicas = self._replicas(by_node, primary, roles, now, beats)
        slots = answered.slots if answered is not None else ()
        self.xids.record(primary.next_xid, primary.at)
        runways = self.forecast.runways(slots, primary.lsn, primary.at if primary.true_at is None else primary.true_at)
        leader = roles.primary.node if roles.primary is not None else None
        return ClusterSnapshot(
            name=self.cluster.name,
            primary_lsn=primary.lsn,
            wal_rate_bytes_per_second=self.forecast.generation_rate(),
            replicas=tuple(replicas),
            walinspect=self.walinspect.add(answered.walinspect) if answered is not None else None,
            nodes=tuple(self.nodes.health(o, roles) for o in observations),
            slas=self.cluster.replica_slas,
            min_replicas=self.cluster.sla.min_replicas,
            primaries=roles.primaries,
            primary_node=leader,
            writer_member=writer_member(roles.primary, observations),
            sync=self._sync(answered, by_node) if answered is not None and not primary.standby else None,
            timeline=roles.timeline,
            role_changes_total=roles.role_changes_total,
            last_role_change=describe_change(roles.last_change),
            last_role_change_ago=max(0.0, now - roles.last_change.at) if roles.last_change is not None else None,
            wal_dating=answered.wal_dating if answered is not None else None,
            heartbeat=(beats.written, beats.failed) if beats is not None else None,
            logical=() if answered is None or primary.standby else self.logical.update(
                slots, answered.logical, primary.lsn, self.clock, primary.wal_dates, primary.senders_at, now),
            rooms=self._rooms(observations, Cycle(now, self.cluster, leader, slots, self.xids.age, runways)),
        )

    def _rooms(self, observations: Sequence[NodeObservation], cycle: Cycle) -> dict[str, Any]:
        """What each room says of the cluster this cycle, from the nodes that answered with its view."""
        out = {}
        for name, keeper in self.rooms.items():
            value = keeper.update({o.node: o.rooms[name] for o in observations if o.ok and name in o.rooms}, cycle)
            if value is not None:
                out[name] = value
        return out

    def _primary(self, roles: RoleView, now: float) -> _PrimaryView:
        """Take the primary's answer into the history: its position on the LSN clock, the
        WAL generation rate, its transaction rate."""
        if roles.changed:  # another server: rates over both would mean nothing
            self.history.forget_xacts()
            self.forecast.reset()
            self._primary_clock = PrimaryClock()
            self._primary_instants = ReadInstants()
        primary = roles.primary
        standby = roles.standby_leader is not None  # the primary is the standby leader, in recovery
        if primary is None or primary.position is None:
            # Its poll failed this cycle: its clock as last read still turns the replicas'
            # commit timestamps into bounds (lsnclock.Commits) where the LSN clock, ending a
            # cycle back, says least (a late poll's cycle is carried over: evidence.py).
            return _PrimaryView(None, now, _NO_PRIMARY, now, self._primary_clock if not standby else None, standby, {})
        position = primary.position
        read_at = primary.answered_at or primary.observed_at  # not later by the extra reads that follow
        true_at = self._primary_instants.instant("primary", primary.asked_at or read_at, read_at, position.clock_epoch)
        lsn = position.current_lsn if not standby else position.received_lsn
        if lsn is not None:
            if self.history.record_primary(lsn, read_at, primary.asked_at,
                                           roles.fork.lsn if roles.fork is not None else None):
                self.forecast.reset()
            self.forecast.note_primary(true_at, lsn)
        if not standby:  # a standby's transactions are its readers', not the writes to replicate
            self.history.note_xacts(read_at, position.xacts_total)
        clock = self._primary_clock
        if standby:  # a standby leader's last replayed commit stands in for its primary's clock
            clock.standby(position.last_replay_epoch, primary.asked_at or primary.observed_at)
        else:  # the poll's own answer, then the WAL reads' that followed it
            clock.note(position.clock_epoch, read_at)
            clock.note_all(primary.wal_clock)
        dated = {name: clock.dated(read) for name, read in primary.wal_commits.items()}
        return _PrimaryView(lsn, read_at, {s.application_name: s for s in primary.walsenders},
                            primary.asked_at or primary.observed_at, clock if clock.offset is not None else None,
                            standby, {name: d for name, d in dated.items() if d is not None}, position.next_xid,
                            true_at=true_at)

    # -- replicas -------------------------------------------------------------------------

    def _replicas(self, by_node: dict[str, NodeObservation], primary: _PrimaryView, roles: RoleView,
                  now: float, beats: Beats | None) -> list[ReplicaState]:
        commits = self._commits(by_node, primary)
        # A configured replica that now accepts writes is a primary, not a replica that lags.
        replicas = [self._configured_replica(r.name, r.walsender_name, by_node.get(r.name), primary, commits[r.name],
                                             now, roles, beats)
                    for r in self.cluster.replicas if by_node.get(r.name) is None
                    or by_node[r.name].observed_role != "primary"]
        configured_names = {r.walsender_name for r in self.cluster.replicas}
        configured_labels = {r.name for r in self.cluster.replicas}
        for name in sorted(set(primary.senders) - configured_names):
            # A walsender named like a configured replica (that replica matched by another
            # application_name) must not share its series nor its window.
            label = f"{name} (not configured)" if name in configured_labels else name
            replicas.append(self._unconfigured_replica(label, primary.senders[name], primary, now))
        for name in self.history.forget_vanished({r.name for r in replicas}, now):
            for part in self._per_replica:
                part.forget(name)
            if name not in configured_labels:  # still polled (a configured replica that now leads): still counted
                for part in self._per_node:
                    part.forget(name)
        return replicas

    def _commits(self, by_node: dict[str, NodeObservation], primary: _PrimaryView) -> dict[str, Commits]:
        """What commit timestamps say of each configured replica (lsnclock.Commits)."""
        at = {r.name: _last_commit_at(by_node.get(r.name), primary.clock) for r in self.cluster.replicas}
        known = [t for t in at.values() if t is not None]
        # In a standby cluster how often its primary commits is not known (its transaction
        # counters are out of reach): a commit's age then only caps an interpolation, and
        # a newer commit elsewhere says nothing (Commits with neither never over-reads).
        newest = max(known) if known and not primary.standby else None
        interval = self.history.commit_interval() if not primary.standby else 0.0
        return {name: Commits(t, newest, interval) for name, t in at.items()}

    def _configured_replica(self, name: str, walsender_name: str, obs: NodeObservation | None,
                            primary: _PrimaryView, commits: Commits, now: float, roles: RoleView,
                            beats: Beats | None) -> ReplicaState:
        sender = primary.senders.get(walsender_name)
        answered = obs if obs is not None and obs.ok else None
        own = answered.position if answered is not None else None
        replay = _own_replay(answered, primary, walsender_name, commits, beats, self._read_at(name, answered)) or \
            self._replay_from_sender(
            name, sender, primary.senders_at, primary.wal_dates.get(walsender_name))
        before = self.history.last_known(name, now)
        follows = follows_primary(sender, obs, roles)
        self.roles.note_follows(name, follows)
        if replay is not None and (capped := self.roles.replayed_of_current(name, replay.lsn)) != replay.lsn:
            # Left on the old timeline after a promotion: it lacks everything since the fork.
            replay = ReplayPosition(capped, replay.at, replay.source)
        receiver = answered.receiver if answered is not None else None
        streaming = replica_streaming(answered, sender)
        reading, catch_up = self._reading(name, replay, sender, now, primary.lsn)
        advanced = None if before is None or replay is None else replay.lsn > before.lsn
        signals = replica_signals(answered, streaming, advanced, sender is not None)
        return replica_state(
            name, reading, catch_up,
            self._diagnose(reading, sender, primary.lsn, own.receive_lsn if own else None, signals),
            configured=True, node_up=obs.ok if obs is not None else False, walsender=sender, streaming=streaming,
            own=own, receiver=receiver, follows_primary=follows, side=self._replay_side(name, answered, now))

    def _read_at(self, name: str, answered: NodeObservation | None) -> float | None:
        """When the replica's answer was true (readinstant.py), not when it was asked for."""
        if answered is None or answered.position is None:
            return None
        asked = answered.asked_at or answered.observed_at
        return self.read_instants.instant(name, asked, answered.answered_at or answered.observed_at,
                                          answered.position.clock_epoch)

    def _replay_side(self, name: str, answered: NodeObservation | None, now: float) -> ReplaySide:
        """The replica's startup process as it answered, its replay load, its conflicts."""
        recovery = answered.recovery if answered is not None else None
        at = (answered.asked_at or answered.observed_at) if answered is not None else now
        return ReplaySide(recovery, self.replay_load.note(name, at, recovery),
                           self.conflicts.note(name, recovery.conflicts if recovery is not None else None))

    def _unconfigured_replica(self, name: str, sender: WalSender, primary: _PrimaryView, now: float) -> ReplicaState:
        reading, catch_up = self._reading(name, self._replay_from_sender(
            name, sender, primary.senders_at, primary.wal_dates.get(sender.application_name)), sender, now, primary.lsn)
        streaming = sender.state == "streaming"
        return replica_state(name, reading, catch_up,
                              self._diagnose(reading, sender, primary.lsn, None, Signals(streaming=streaming)),
                              configured=False, node_up=None, walsender=sender, streaming=streaming)

    def _diagnose(self, reading: LagReading, sender: WalSender | None, current: int | None, received: int | None,
                  signals: Signals) -> Diagnosis | None:
        """Where the reading's staleness sits and why (diagnosis.py), each stage's boundary
        dated by the LSN clock at the reading's instant."""
        staleness, at = reading.staleness, reading.staleness_at
        if staleness is None or at is None:
            return None

        def dated(lsn: int) -> float | None:
            return self.clock.age(lsn, at)

        positions = Positions(current, sender.sent_lsn if sender else None, sender.write_lsn if sender else None,
                              sender.flush_lsn if sender else None, received, reading.replay_lsn)
        return diagnose(staleness, positions, dated, signals)

    def _replay_from_sender(self, name: str, sender: WalSender | None, at: float,
                            wal: WalDates | None = None) -> ReplayPosition | None:
        if sender is not None and sender.replay_lsn is not None:
            return ReplayPosition(sender.replay_lsn, at, "primary", wal=wal)
        return self.history.last_known(name, at)

    def _reading(self, name: str, replay: ReplayPosition | None, sender: WalSender | None, now: float,
                 primary_lsn: int | None) -> tuple[LagReading, CatchUp | None]:
        """The replica's reading (history.py) and its catch-up forecast (rates.py)."""
        reading = self.history.reading(name, replay, sender, now)
        catch_up = None
        if replay is not None and primary_lsn is not None:
            at = replay.at if reading.staleness is not None else now
            catch_up = self.forecast.catch_up(name, replay.lsn, at, primary_lsn, within=self.interval)
        return reading, catch_up

    # -- cluster-wide ---------------------------------------------------------------------

    def _sync(self, primary: NodeObservation, by_node: dict[str, NodeObservation]) -> SyncReplication | None:
        assert primary.position is not None
        if primary.position.sync_standby_names is None:
            return None
        delays = {}
        for r in self.cluster.replicas:
            obs = by_node.get(r.name)
            if obs is not None and obs.position is not None and obs.position.apply_delay_seconds:
                delays[r.walsender_name] = obs.position.apply_delay_seconds
        sync = assess(primary.position.sync_standby_names, primary.position.synchronous_commit or "on",
                      primary.walsenders, delays)
        if sync.error != self._sync_error:
            if sync.error:
                log.warning("%s: synchronous_standby_names %r does not parse (%s): synchronous replication "
                            "is not assessed", self.cluster.name, sync.standby_names, sync.error)
            self._sync_error = sync.error
        return sync


def _own_replay(answered: NodeObservation | None, primary: _PrimaryView, walsender_name: str, commits: Commits,
                beats: Beats | None, at: float | None) -> ReplayPosition | None:
    """Where the replica says its replay stands, with all that dates it: commit timestamps,
    the primary's WAL past its walsender's position, the heartbeat it has replayed."""
    own = answered.position if answered is not None else None
    if answered is None or own is None or not own.in_recovery or own.replay_lsn is None or at is None:
        return None
    beat = beats.bounds(answered.heartbeat_seq, at) if beats is not None and answered.heartbeat_seq is not None \
        else None
    return ReplayPosition(own.replay_lsn, at, "replica", commits, primary.wal_dates.get(walsender_name), beat)


def _last_commit_at(obs: NodeObservation | None, clock: PrimaryClock | None) -> float | None:
    """When (lagwatch's clock) the primary made the last commit this replica has replayed."""
    if obs is None or not obs.ok or obs.position is None or clock is None:
        return None
    return clock.monotonic(obs.position.last_replay_epoch)
