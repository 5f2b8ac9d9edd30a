"""Who is the primary now: roles as observed each cycle, never as configured.

A node's role is what it says (``pg_is_in_recovery()``); the configured ``primary`` is only
the DSN that finds the writer (often multi-host with ``target_session_attrs=read-write``).
One server may answer under two names (that DSN lands on a promoted replica): servers are
told apart by ``server_id`` (postmaster start time and port), so one server is never two
primaries. In a standby cluster the primary DSN reaches the standby leader: in recovery,
replicating from outside the cluster, it stands for the primary (its received WAL dates
the LSN clock) and its role is ``standby_leader``. Pure: observations in, a ``RoleView``
out; the only state is what the last cycles showed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from lagwatch.estimate.snapshot import NodeObservation, ObservedRole
from lagwatch.fastinit import fast_init
from lagwatch.lsn import format_lsn

log = logging.getLogger("lagwatch.estimate.roles")


@dataclass(frozen=True)
class Fork:
    """Where the current primary's timeline left the previous primary's WAL: a replica
    still on an older timeline has nothing of the new primary's past ``lsn``."""

    timeline: int
    lsn: int


@dataclass(frozen=True)
class RoleChange:
    """The last node seen to change role, and when (monotonic)."""

    node: str
    before: ObservedRole
    after: ObservedRole
    timeline: int | None
    at: float


@fast_init
@dataclass(frozen=True)
class RoleView:
    primary: NodeObservation | None  # the answer that dates the LSN clock this cycle
    primaries: int  # distinct servers accepting writes
    timeline: int | None  # the primary's
    fork: Fork | None  # the last promotion seen, while replicas may still be on the old timeline
    changed: bool  # the primary is another server than last cycle's (the LSN history must follow)
    role_changes_total: int
    last_change: RoleChange | None = None
    standby_leader: str | None = None  # the standby leader's server_id (a standby cluster)

    def role_of(self, obs: NodeObservation) -> ObservedRole:
        """The node's role this cycle: a node on the standby leader's server is the standby leader."""
        return _role(obs, self.standby_leader)


def _the_primary(writers: Sequence[NodeObservation]) -> NodeObservation | None:
    """The configured primary DSN is where applications write: with two writers it is the
    one that counts. Otherwise the writer on the newest timeline."""
    primary = next((o for o in writers if o.role == "primary"), None)
    if primary is None and writers:
        primary = max(writers, key=lambda o: o.timeline or 0)
    return primary


def _role(obs: NodeObservation, standby_leader: str | None) -> ObservedRole:
    role = obs.observed_role
    if role == "replica" and standby_leader is not None and obs.server_id == standby_leader:
        return "standby_leader"
    return role


class RoleTracker:
    def __init__(self, cluster: str, standby_cluster: bool = False) -> None:
        self.cluster = cluster
        self.standby_cluster = standby_cluster
        self._roles: dict[str, ObservedRole] = {}  # node -> last known role (never "unknown")
        self._primary_server: str | None = None
        self._primary_timeline: int | None = None
        self._replica_replay: dict[str, int] = {}  # node -> replay LSN, last cycle (replicas)
        self._fork: Fork | None = None
        self._changes = 0
        self._last_change: RoleChange | None = None
        self._said_primaries: int | None = None
        self._followed_fork: Fork | None = None  # the promotion the set below is about
        self._followed_since_fork: set[str] = set()  # replicas seen following the new primary since

    def note_follows(self, replica: str, follows: bool | None) -> None:
        """Whether ``replica`` was seen following the current primary this cycle."""
        if self._fork != self._followed_fork:
            self._followed_fork, self._followed_since_fork = self._fork, set()
        if follows:
            self._followed_since_fork.add(replica)

    def replayed_of_current(self, replica: str, lsn: int) -> int:
        """How much of the current primary's WAL a replica that replayed up to ``lsn`` has:
        all of it if it followed the new primary since the last promotion (note_follows);
        if not (left on the old timeline), what it replayed past the fork is not the new
        primary's WAL, so no more than the fork. One that did follow and only lost its
        connection later is not held back to the fork."""
        fork = self._fork
        if fork is not None and replica not in self._followed_since_fork and lsn > fork.lsn:
            return fork.lsn
        return lsn

    def observe(self, observations: Sequence[NodeObservation]) -> RoleView:
        writers = [o for o in observations if o.observed_role == "primary"]
        # A standby cluster's primary DSN answering in recovery (no member accepts writes):
        # the standby leader, which every other member replicates from.
        standby = next((o for o in observations if self.standby_cluster and not writers and o.role == "primary"
                        and o.observed_role == "replica" and o.server_id), None)
        standby_leader = standby.server_id if standby is not None else None
        for obs in observations:
            self._note_role(obs, _role(obs, standby_leader))
        primaries = len({o.server_id or f"node {o.node}" for o in writers})
        self._say_primaries(writers, primaries, standby)
        primary = _the_primary(writers) or standby
        changed = primary is not None and self._follow(primary, observations)
        self._replica_replay = {o.node: o.position.replay_lsn for o in observations
                                if o.observed_role == "replica" and o.position is not None
                                and o.position.replay_lsn is not None}
        return RoleView(primary=primary, primaries=primaries, timeline=primary.timeline if primary else None,
                        fork=self._fork, changed=changed, role_changes_total=self._changes,
                        last_change=self._last_change, standby_leader=standby_leader)

    def _follow(self, primary: NodeObservation, observations: Sequence[NodeObservation]) -> bool:
        """Take ``primary`` as this cycle's; whether it is another server than last cycle's."""
        server = primary.server_id
        changed = self._primary_server is not None and server != self._primary_server
        if changed:
            self._note_new_primary(primary, observations)
        self._primary_server = server
        self._primary_timeline = primary.timeline
        return changed

    def _note_role(self, obs: NodeObservation, role: ObservedRole) -> None:
        if role == "unknown":
            return  # down says nothing about its role: it keeps the last one known
        before = self._roles.get(obs.node)
        self._roles[obs.node] = role
        if before is not None and before != role:
            self._changes += 1
            self._last_change = RoleChange(obs.node, before, role, obs.timeline, obs.observed_at)
            timeline = f" on timeline {obs.timeline}" if obs.timeline is not None else ""
            log.warning("%s/%s: role changed: was a %s, now a %s%s", self.cluster, obs.node, before, role, timeline)

    def _note_new_primary(self, primary: NodeObservation, observations: Sequence[NodeObservation]) -> None:
        # Its names: the writers on its server. A replica is never the same server as a
        # writer, whatever its server_id says (postmaster start time and port: CI once saw
        # two replicas started together report the same).
        names = sorted({o.node for o in observations if o.observed_role == "primary" and o.server_id is not None
                        and o.server_id == primary.server_id})
        timeline = primary.timeline
        promoted = (timeline is not None and self._primary_timeline is not None and timeline > self._primary_timeline)
        log.warning("%s: the primary is now another server (%s)%s", self.cluster, " = ".join(names),
                    f", on timeline {timeline} (was {self._primary_timeline})" if promoted else "")
        if not promoted or timeline is None:
            return
        # The promoted server replayed at least this much of the old timeline before it
        # switched: a floor for the fork point, so a replica left on the old timeline is
        # never credited with WAL the new primary does not have.
        # (by node: its names now that answered as a replica last cycle)
        before = [self._replica_replay[n] for n in names if n in self._replica_replay]
        replayed = max(before) if before else None
        current = primary.position.current_lsn if primary.position is not None else None
        lsn = replayed if replayed is not None else current
        if lsn is not None:
            self._fork = Fork(timeline, lsn)
            log.info("%s: replicas on a timeline before %d count as replayed up to %s at most",
                     self.cluster, timeline, format_lsn(lsn))

    def _say_primaries(self, writers: Sequence[NodeObservation], primaries: int,
                       standby: NodeObservation | None) -> None:
        said = -1 if standby is not None else primaries  # -1: a standby leader stands for the primary
        if said == self._said_primaries:
            return
        if standby is not None:
            log.info("%s: a standby cluster: its primary DSN reaches the standby leader (in recovery), which the "
                     "other members replicate from", self.cluster)
        elif primaries >= 2:
            log.error("%s: split brain: %d servers accept writes (%s)", self.cluster, primaries,
                      ", ".join(sorted(o.node for o in writers)))
        elif primaries == 0:
            log.warning("%s: no node accepts writes (no primary answers)", self.cluster)
        elif self._said_primaries is not None:
            log.info("%s: one primary again (%s)", self.cluster, ", ".join(sorted(o.node for o in writers)))
        self._said_primaries = said


def describe_change(change: RoleChange | None) -> str | None:
    if change is None:
        return None
    timeline = f" (timeline {change.timeline})" if change.timeline is not None else ""
    return f"{change.node}: {change.before} -> {change.after}{timeline}"


def writer_member(primary: NodeObservation | None, observations: Sequence[NodeObservation]) -> str | None:
    """The replica-named node on the server that accepts writes now: the primary itself
    when it answered under a replica's name, else a node on the same server as the primary
    DSN's answer (a discovered cluster's leader member; a promoted replica of a static one)."""
    if primary is None:
        return None
    if primary.role != "primary":
        return primary.node
    return next((o.node for o in observations if o.role != "primary" and o.observed_role == "primary"
                 and o.server_id is not None and o.server_id == primary.server_id), None)
