"""A replica's state assembled from typed parts: its reading (history.LagReading), what
its own answer says of its WAL receiver and replay, and whether it follows the primary.
Pure: the tracker (tracker.py) gathers the parts each cycle; ``replica_state`` is the one
place a ReplicaState is built, every field passed by name, so that mypy checks each one
from the view that read it to the snapshot."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lagwatch.estimate.diagnosis import Diagnosis, Signals
from lagwatch.estimate.history import LagReading
from lagwatch.estimate.rates import CatchUp
from lagwatch.estimate.replayload import ReplayLoad
from lagwatch.estimate.roles import RoleView
from lagwatch.estimate.snapshot import NodeObservation, ReplicaState
from lagwatch.views.recovery import Recovery
from lagwatch.views.replication import WalSender
from lagwatch.views.server import ServerPosition
from lagwatch.views.wal_receiver import WalReceiver


@dataclass(frozen=True)
class ReplaySide:
    """What a configured replica's own answer says of its replay process."""

    recovery: Recovery | None
    replay_load: ReplayLoad | None
    conflicts_total: Mapping[str, int]


def replica_state(name: str, reading: LagReading, catch_up: CatchUp | None, diagnosis: Diagnosis | None, *,
                   configured: bool, node_up: bool | None, walsender: WalSender | None, streaming: bool | None,
                   own: ServerPosition | None = None, receiver: WalReceiver | None = None,
                   follows_primary: bool | None = None, side: ReplaySide | None = None) -> ReplicaState:
    """The one place a ReplicaState is assembled, every field by name from a typed value."""
    return ReplicaState(
        name=name,
        configured=configured,
        node_up=node_up,
        walsender=walsender,
        streaming=streaming,
        staleness=reading.staleness,
        staleness_source=reading.staleness_source,
        staleness_evidence=reading.staleness_evidence,
        staleness_bound=reading.staleness_bound,
        staleness_at=reading.staleness_at,
        replay_lsn=reading.replay_lsn,
        window=reading.window,
        histogram=reading.histogram,
        samples=reading.samples,
        catch_up=catch_up,
        diagnosis=diagnosis,
        receive_lsn=own.receive_lsn if own else None,
        receive_replay_bytes=own.receive_replay_bytes if own else None,
        replay_pause_state=own.replay_pause_state if own else None,
        last_replay_age_seconds=own.last_replay_age_seconds if own else None,
        wal_receiver_status=receiver.status if receiver else None,
        follows_primary=follows_primary,
        recovery=side.recovery if side else None,
        replay_load=side.replay_load if side else None,
        conflicts_total=side.conflicts_total if side else {},
    )


def replica_signals(answered: NodeObservation | None, streaming: bool | None, advanced: bool | None,
             walsender: bool) -> Signals:
    """What a replica's own answer says about its replay, for the diagnosis."""
    own = answered.position if answered is not None else None
    receiver = answered.receiver if answered is not None else None
    return Signals(answered.recovery if answered is not None else None, own.replay_pause_state if own else None,
                   own.apply_delay_seconds if own else None, streaming, receiver.status if receiver else None,
                   receiver.last_msg_age if receiver else None, advanced, walsender, answered is not None)


def follows_primary(sender: WalSender | None, obs: NodeObservation | None, roles: RoleView) -> bool | None:
    """Whether a replica replicates from the current primary: the primary streams to it, or
    (cascaded, or the primary's view hidden) its WAL receiver is on the primary's timeline."""
    if roles.primary is None:
        return None
    if sender is not None:
        return True
    timeline = obs.timeline if obs is not None else None
    if timeline is not None and roles.timeline is not None:
        return timeline >= roles.timeline
    # No walsender for it: that says "not following" only if the primary's replication
    # view was read (a missing grant or a resting view is no evidence; the pool policy
    # ejects on False).
    return False if roles.primary.views.get("replication", True) else None


def replica_streaming(answered: NodeObservation | None, sender: WalSender | None) -> bool | None:
    """Whether the replica's WAL receiver streams: its own view; else, not reachable or its
    receiver view not readable, the primary's; None when both are hidden from this role
    (no pg_read_all_stats)."""
    receiver = answered.receiver if answered is not None else None
    if receiver is not None:
        return receiver.streaming
    if sender is not None and sender.state is not None:
        return sender.state == "streaming"
    if sender is not None or (answered is not None and answered.views.get("wal_receiver") is False):
        return None
    return False
