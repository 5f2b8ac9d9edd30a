"""The immutable values one cycle produces.

A poll yields one ``NodeObservation`` per node; the tracker folds them into a
``ClusterSnapshot``; the daemon publishes a ``Snapshot`` by swapping one reference.
``/metrics``, ``/api/status`` and ``lagwatch check`` only ever read these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from lagwatch.config import ReplicaSla
from lagwatch.estimate.diagnosis import Diagnosis
from lagwatch.estimate.rates import CatchUp
from lagwatch.estimate.replayload import ReplayLoad
from lagwatch.estimate.syncrep import SyncReplication
from lagwatch.estimate.windows import HistogramCounts, WindowStats
from lagwatch.fastinit import fast_init
from lagwatch.rooms.slots import Slot
from lagwatch.views.probe import Capabilities
from lagwatch.views.recovery import Recovery
from lagwatch.views.replication import LogicalSender, WalSender
from lagwatch.views.server import ServerPosition
from lagwatch.views.wal_receiver import WalReceiver
from lagwatch.views.walcommits import WalCommits, WalDatingTotals
from lagwatch.views.walinspect import WalInspection, WalInspectTotals

Role = Literal["primary", "replica"]  # the slot a node is configured in: only a name
# What a node is, as observed each cycle: a primary accepts writes (not in recovery);
# standby_leader (a Patroni standby cluster's leader) comes from Patroni; unknown: no answer.
ObservedRole = Literal["primary", "replica", "standby_leader", "unknown"]
OBSERVED_ROLES: tuple[ObservedRole, ...] = ("primary", "replica", "standby_leader", "unknown")
ErrorKind = Literal["connect", "timeout", "query"]
# Why a node's answer is missing when that is no evidence about the node (lateness.py):
# lagwatch got to its answer too late, or its first connection is still under way.
Pending = Literal["late", "connecting"]


@fast_init
@dataclass(frozen=True)
class NodeObservation:
    """What one node said in one cycle (or why it said nothing): the poll's answer as one
    value, each view's part as its parser typed it (views/), and what the poll knows of
    itself (when it asked, when the answer came, its counters). poll.py builds it once from
    the views' results and adds the poll's facts when the poll ends."""

    cluster: str
    node: str
    role: Role  # the configured slot ("primary": the DSN that finds the writer), not what it is
    observed_at: float  # monotonic time the answer arrived
    duration: float  # seconds spent on this node this cycle
    # Monotonic time the query was sent: what it read was true at some moment between this
    # and observed_at. A replay position is dated here, so that a reply slowed on its way
    # (a busy event loop) cannot make it look older than it was.
    asked_at: float | None = None
    # Monotonic time its own views answered, before the primary's extra reads (the WAL's
    # commit times, FPI statistics): its position and clock were read between asked_at and
    # this, which observed_at, later by those reads, would date late.
    answered_at: float | None = None
    capabilities: Capabilities | None = None
    position: ServerPosition | None = None
    walsenders: tuple[WalSender, ...] = ()
    receiver: WalReceiver | None = None
    walinspect: WalInspection | None = None
    # The primary's: the commits in its WAL just past each walsender's replay position
    # (by application_name), where lagwatch may read them (commitscan.py), on its clock;
    # and that clock as those reads took it, (its epoch seconds, when answered): what
    # estimate/clock.PrimaryClock takes with the poll's own.
    wal_commits: Mapping[str, WalCommits] = field(default_factory=dict)
    wal_clock: tuple[tuple[float, float], ...] = ()
    heartbeat_seq: int | None = None  # a replica's: the heartbeat it has replayed (heartbeat.py)
    recovery: Recovery | None = None  # a replica's startup process and conflicts (views/recovery.py)
    logical: tuple[LogicalSender, ...] = ()  # the primary's logical walsenders (views/replication.py)
    rooms: Mapping[str, Any] = field(default_factory=dict)  # each room's reading (lagwatch.rooms), by room
    wal_dating: WalDatingTotals | None = None  # the primary's reads to date staleness, since start
    # Per view: whether it was read this cycle (False: it failed, rests after a failure, or
    # the role may not read it). Views that do not apply to the node's role are absent.
    views: dict[str, bool] = field(default_factory=dict)
    view_errors_total: dict[str, int] = field(default_factory=dict)  # failed reads since start, by view
    connects_total: int = 0  # connection attempts to the node since start
    error_kind: ErrorKind | None = None
    error: str | None = None  # one line, never containing a password
    pending: Pending | None = None  # no answer, and no evidence either way (see Pending)

    @property
    def slots(self) -> tuple[Slot, ...]:
        """The primary's replication slots as its poll read them: the slots' room's reading
        (rooms/slots.py), which the estimate stage reads too (forecasts, logical consumers)."""
        slots: tuple[Slot, ...] = self.rooms.get("slots", ())
        return slots

    def polled(self, *, observed_at: float, duration: float, asked_at: float, wal_dating: WalDatingTotals | None,
               wal_clock: tuple[tuple[float, float], ...], view_errors_total: dict[str, int],
               connects_total: int) -> NodeObservation:
        """This answer with what the poll knows of itself once it ends. Its fields copied as
        fast_init fills them (``dataclasses.replace`` walks every field: 4.7 us against
        about 1, once per node and cycle in a fleet)."""
        out: NodeObservation = object.__new__(NodeObservation)
        out.__dict__.update(self.__dict__)
        out.__dict__.update(observed_at=observed_at, duration=duration, asked_at=asked_at, wal_dating=wal_dating,
                            wal_clock=wal_clock, view_errors_total=view_errors_total, connects_total=connects_total)
        return out

    @property
    def ok(self) -> bool:
        return self.error_kind is None and self.pending is None

    @property
    def observed_role(self) -> ObservedRole:
        if not self.ok or self.position is None:
            return "unknown"
        return "replica" if self.position.in_recovery else "primary"

    @property
    def timeline(self) -> int | None:
        """The timeline a primary writes on, or a replica's WAL receiver last received on."""
        if not self.ok or self.position is None:
            return None
        if not self.position.in_recovery:
            return self.position.timeline
        return self.receiver.timeline if self.receiver is not None else None

    @property
    def server_id(self) -> str | None:
        return self.position.server_id if self.ok and self.position is not None else None


@fast_init
@dataclass(frozen=True)
class ReplicaState:
    """Everything lagwatch knows about one replica after a cycle."""

    name: str
    configured: bool  # in the config (else only seen in pg_stat_replication)
    staleness: float | None  # the headline: age of the oldest unreplayed change, seconds
    staleness_source: str | None  # where the replay LSN came from: replica | primary | last_known
    window: WindowStats | None
    histogram: HistogramCounts
    replay_lsn: int | None
    streaming: bool | None  # None: this role may not see it (no pg_read_all_stats)
    node_up: bool | None  # None for replicas not in the config (not polled directly)
    receive_lsn: int | None = None
    receive_replay_bytes: int | None = None
    replay_pause_state: str | None = None
    wal_receiver_status: str | None = None
    last_replay_age_seconds: float | None = None
    walsender: WalSender | None = None
    samples: Sequence[tuple[float, float]] = ()  # (monotonic time, staleness) over the window (windows.LagSamples)
    staleness_evidence: str | None = None  # what dated it (lsnclock.Evidence): interpolated, commit_timestamp, ...
    staleness_bound: str | None = None  # the proven bound that held it, if one did (estimate.dating.Bound)
    staleness_at: float | None = None  # monotonic time the reading is for (when the replay LSN was read)
    # Whether it replicates from the current primary: that primary has a walsender for it,
    # or its WAL receiver is on the primary's timeline. None: cannot tell (no primary).
    follows_primary: bool | None = None
    catch_up: CatchUp | None = None  # replay rate, backlog and ETA (None: no replay position)
    diagnosis: Diagnosis | None = None  # where its staleness sits and why (diagnosis.py)
    replay_load: ReplayLoad | None = None  # how busy its startup process is (replayload.py)
    recovery: Recovery | None = None  # its startup process, conflicts by type (views/recovery.py)
    conflicts_total: Mapping[str, int] = field(default_factory=dict)  # cancelled queries by type, never falling

    @property
    def replay_paused(self) -> bool | None:
        if self.replay_pause_state is None:
            return None
        return self.replay_pause_state != "not paused"


# A replica's condition, worst first: the one word the log line, `lagwatch check`, /status
# and /api/status all show (replica_condition decides it, for all of them).
Condition = Literal["down", "cannot_see", "not_streaming", "paused", "unknown", "behind", "streaming"]
CONDITION_TEXT: dict[Condition, str] = {
    "down": "down", "cannot_see": "cannot see pg_stat_wal_receiver: grant pg_read_all_stats",
    "not_streaming": "not streaming", "paused": "replay paused", "unknown": "lag unknown",
    "behind": "behind", "streaming": "streaming",
}


def replica_condition(replica: ReplicaState, sla: ReplicaSla | None) -> Condition:
    """down: lagwatch cannot reach it; cannot_see: this role may not see whether it streams
    (no pg_read_all_stats); not_streaming: its WAL receiver is not streaming;
    paused: replay is paused (or a pause requested); unknown: no staleness could be read;
    behind: staleness over its SLA's max_lag; else streaming."""
    if replica.node_up is False:
        return "down"
    if replica.streaming is None:
        return "cannot_see"
    if not replica.streaming:
        return "not_streaming"
    if replica.replay_paused:
        return "paused"
    if replica.staleness is None:
        return "unknown"
    if sla is not None and replica.staleness > sla.max_lag:
        return "behind"
    return "streaming"


@fast_init
@dataclass(frozen=True)
class LogicalConsumer:
    """A logical slot on the primary and whoever streams from it (logical.py)."""

    slot: str
    consumer: str  # who streams from it: a subscription's name, a client's application_name (the last seen)
    active: bool  # a walsender streams from the slot now
    state: str | None  # the walsender's: startup | catchup | streaming | stopping (None: none)
    database: str | None
    plugin: str | None
    position: int | None  # what it applied or confirmed (views/replication.LogicalSender.position)
    lag_bytes: int | None  # the primary's current LSN less that position
    staleness: float | None  # age of the oldest change it has not confirmed, seconds
    evidence: str | None  # what dated it (lsnclock.Evidence): wal_commit, lsn_clock, caught_up, ...
    staleness_at: float | None  # monotonic time the reading is for
    window: WindowStats | None


@fast_init
@dataclass(frozen=True)
class NodeHealth:
    name: str
    role: Role  # configured slot
    up: bool
    version_num: int | None
    poll_duration: float
    polls_total: int
    errors_total: dict[str, int]  # by error kind; a frozen copy per snapshot
    last_error: str | None
    skipped: dict[str, str]  # view -> why it is not read on this connection
    views: dict[str, bool] = field(default_factory=dict)  # view -> read this cycle
    view_errors_total: dict[str, int] = field(default_factory=dict)
    observed_role: ObservedRole = "unknown"
    timeline: int | None = None
    connects_total: int = 0  # connection attempts since start (a poll still under way: as last known)


@dataclass(frozen=True)
class PoolEvent:
    at: float  # wall clock
    member: str
    action: str  # eject | readmit | add | remove
    reason: str
    staleness: float | None
    p95: float | None
    dry_run: bool


LEADER_APPLICATION_NAME = "lagwatch-leader"  # what lagwatch's leader-lock session calls itself


@dataclass(frozen=True)
class LockHolder:
    """The session holding the leader lock, as pg_locks and pg_stat_activity show it."""

    pid: int
    application_name: str
    user: str
    client_addr: str
    is_us: bool
    # It runs as the role lagwatch's own leader session logs in as. Any session may call
    # itself lagwatch-leader; only one of lagwatch's role is taken for another instance.
    lagwatch_role: bool = True

    @property
    def is_lagwatch(self) -> bool:
        return self.application_name == LEADER_APPLICATION_NAME and self.lagwatch_role

    def describe(self) -> str:
        who = f"pid {self.pid}, application_name {self.application_name!r}, user {self.user!r}"
        return who + (f", from {self.client_addr}" if self.client_addr else "")


@dataclass(frozen=True)
class PoolStatus:
    kind: str
    leader: bool
    dry_run: bool
    members: frozenset[str] | None  # the decision; None before the pooler could be read once
    pooler_members: frozenset[str] | None  # what the pooler itself says, read back each cycle
    reasons: dict[str, str]
    holds: dict[str, str]
    changes_total: dict[tuple[str, str], int]  # (member, action) -> count
    apply_errors_total: int
    read_errors_total: int  # the pooler's own view could not be read
    last_error: str | None
    events: tuple[PoolEvent, ...]
    leader_holder: LockHolder | None = None  # who holds the leader lock (this instance included)


@fast_init
@dataclass(frozen=True)
class ClusterSnapshot:
    name: str
    primary_lsn: int | None
    wal_rate_bytes_per_second: float | None
    replicas: tuple[ReplicaState, ...]
    walinspect: WalInspectTotals | None
    nodes: tuple[NodeHealth, ...]
    slas: dict[str, ReplicaSla] = field(default_factory=dict)  # configured replicas' SLAs
    min_replicas: int = 0
    pool: PoolStatus | None = None
    primaries: int = 0  # distinct servers that accept writes (2 or more: split brain)
    primary_node: str | None = None  # the node whose answers dated the LSN clock this cycle
    # The replica-named node that accepts writes now (the configured primary DSN may land on
    # it): where a fallback to the primary routes reads. None if only the primary DSN does.
    writer_member: str | None = None
    timeline: int | None = None  # the current primary's
    role_changes_total: int = 0  # nodes seen to change role (replica <-> primary) since start
    # The last role change: "replica1: replica -> primary (timeline 2)", and how long before this cycle.
    last_role_change: str | None = None
    last_role_change_ago: float | None = None
    sync: SyncReplication | None = None  # synchronous replication on the primary (None: no answer)
    # Cycles in a row this cluster was carried over as an earlier cycle left it, because
    # lagwatch got to some of its answers too late to count them (0: as of this cycle).
    carried_cycles: int = 0
    wal_dating: WalDatingTotals | None = None  # reads to date staleness from commits, since start
    heartbeat: tuple[int, int] | None = None  # the heartbeat's (beats written, failed attempts); None: off
    logical: tuple[LogicalConsumer, ...] = ()  # the primary's logical slots and their consumers (logical.py)
    rooms: Mapping[str, Any] = field(default_factory=dict)  # what each room says of the cluster, by room


@dataclass(frozen=True)
class DiscoveryStatus:
    """What the last attempt to discover one cluster's members gave."""

    cluster: str
    up: bool  # the last attempt gave a usable membership
    members: int  # in the membership in force (the last known one when down)
    errors_total: int
    last_success_at: float | None  # wall-clock time
    source: str | None  # the URL that answered last
    error: str | None
    # (member, role, state) as Patroni said last: leader, replica, sync_standby, quorum_standby...
    patroni_members: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True)
class Snapshot:
    taken_at: float  # wall clock (for people), never used for lag
    cycle_duration: float
    cycles_total: int
    overruns_total: int
    clusters: tuple[ClusterSnapshot, ...]
    reload_successful: bool = True  # the last reload was put in force (true before any)
    reload_success_at: float = 0.0  # wall clock of the last config put in force (the start counts)
    background_errors_total: int = 0  # background tasks that failed (each logged with its trace)
    discovery: tuple[DiscoveryStatus, ...] = ()  # one per cluster whose members Patroni names
    # (quantile, seconds) of the recent cycles' durations: how close cycles come to the interval.
    cycle_quantiles: tuple[tuple[float, float], ...] = ()  # the first cycle's left out: it connects to every node
    first_cycle_duration: float | None = None
    cycle_histogram: HistogramCounts | None = None  # every cycle's duration since start but the first's
    # clusters_dir: each cluster file and why it cannot be used as it is (None: in force as is).
    cluster_files: tuple[tuple[str, str | None], ...] = ()
    shard: tuple[int, int] | None = None  # (index, count) of this instance's part of a sharded fleet
    interval: float = 0.0  # the configured interval (seconds)
    effective_interval: float = 0.0  # the interval lagwatch keeps now: longer while cycles do not fit
    loop_lag: float = 0.0  # the worst lateness of lagwatch's event loop since the last cycle (seconds)
    late_answers_total: int = 0  # answers got to too late to count for or against their node, since start
    # (cluster, node) of the nodes still making their first connection: they read neither
    # up nor down, and a cluster is published once each of its nodes has answered or failed.
    connecting: tuple[tuple[str, str], ...] = ()


class SnapshotHolder:
    """The last published snapshot. Publishing is one reference assignment, so readers in
    other threads (the HTTP server) always see a complete snapshot."""

    def __init__(self) -> None:
        self._snapshot: Snapshot | None = None
        # Called with each snapshot before readers see it (in the publisher's thread; must
        # not raise): what they prepare from it is ready when the first reader comes.
        self.on_publish: list[Callable[[Snapshot], None]] = []

    def get(self) -> Snapshot | None:
        return self._snapshot

    def publish(self, snapshot: Snapshot) -> None:
        try:
            for hook in self.on_publish:
                hook(snapshot)
        finally:
            self._snapshot = snapshot  # published whatever a hook did
