"""Folds each cycle's observations of one cluster into an immutable ClusterSnapshot.

This is the only place that keeps history between cycles (the LSN clock, the windows, the
counters); everything it keeps is bounded. It does no I/O: observations carry their own
monotonic timestamps.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from lagwatch.config import ClusterConfig
from lagwatch.durations import format_duration
from lagwatch.fastinit import fast_init
from lagwatch.lag import (
    Commits,
    HistogramCounts,
    LagHistogram,
    LagSamples,
    LagWindow,
    LsnClock,
    Staleness,
    WindowStats,
)
from lagwatch.lsn import format_lsn
from lagwatch.rates import CatchUp, Progress, catch_up, runway
from lagwatch.roles import Fork, RoleChange, RoleTracker, RoleView
from lagwatch.snapshot import (
    ClusterSnapshot,
    NodeHealth,
    NodeObservation,
    ReplicaState,
    WalInspectTotals,
)
from lagwatch.syncrep import SyncReplication, assess
from lagwatch.views.replication import WalSender
from lagwatch.views.server import ServerPosition
from lagwatch.views.slots import Slot

log = logging.getLogger("lagwatch.tracker")

# The LSN clock's bound. The clock thins itself whenever it has doubled since it was last
# thinned, keeping the last 64 polls exact and older history to 1/64 of its age. Thinning
# again what was thinned before keeps more points than needed, so it grows with uptime,
# slowly: simulated at one poll a second it holds ~370 points on average over its first
# half hour, ~900 over a day, ~1,130 over a week, and 1,536 keep 1/64 through 5 million
# polls (58 days at 1 s, 14 hours at 10 ms). Past that, the resolution halves rather than
# the bound growing: at most 12 MB of clocks for 300 clusters.
_CLOCK_MAX_POINTS = 1536
# The primary's transaction rate is taken over spans of at least _XACT_MIN_SPAN_SECONDS
# ending at the last poll, within this horizon: its counters reach pg_stat_database up to
# a second late and in lumps.
_XACT_HORIZON_SECONDS = 30.0
_XACT_MIN_SPAN_SECONDS = 2.0


@dataclass
class _NodeCounters:
    polls: int = 0
    connects: int = 0  # connection attempts, as the node's poller last counted them
    errors: dict[str, int] = field(default_factory=dict)
    up: bool | None = None  # as last said in the log (None: nothing said yet)
    down_since: float | None = None


class _LagFields(TypedDict):
    staleness: float | None
    staleness_source: str | None
    staleness_evidence: str | None
    staleness_at: float | None
    replay_lsn: int | None
    window: WindowStats | None
    histogram: HistogramCounts
    samples: LagSamples
    catch_up: CatchUp | None


@fast_init
@dataclass(frozen=True)
class _PrimaryClock:
    """The primary's wall clock read against our monotonic clock in one poll: turns a
    timestamp the primary wrote (a commit's) into our time, without comparing two hosts'
    clocks. Off by at most the poll's round trip."""

    observed_at: float
    epoch: float

    @classmethod
    def of(cls, primary: NodeObservation) -> _PrimaryClock | None:
        epoch = primary.position.clock_epoch if primary.position is not None else None
        return None if epoch is None else cls(primary.observed_at, epoch)

    @classmethod
    def of_standby_leader(cls, leader: NodeObservation) -> _PrimaryClock | None:
        """A standby cluster's commits were stamped by a primary lagwatch does not poll:
        their ages are read against the standby leader's last replayed commit, taken as
        of the moment it was asked (only differences between that primary's stamps, no
        two hosts' clocks). Measured this way a replica's commit lag behind the standby
        leader is short by at most the age of the standby leader's own last commit."""
        epoch = leader.position.last_replay_epoch if leader.position is not None else None
        return None if epoch is None else cls(leader.asked_at or leader.observed_at, epoch)

    def monotonic(self, epoch: float) -> float:
        return self.observed_at - (self.epoch - epoch)


def _last_commit_at(obs: NodeObservation | None, primary_clock: _PrimaryClock | None) -> float | None:
    """When (our clock) the primary made the last commit this replica has replayed."""
    if obs is None or not obs.ok or obs.position is None or primary_clock is None:
        return None
    epoch = obs.position.last_replay_epoch
    return None if epoch is None else primary_clock.monotonic(epoch)


def _follows_primary(sender: WalSender | None, obs: NodeObservation | None, roles: RoleView) -> bool | None:
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


def _received(position: ServerPosition) -> int | None:
    """What a standby leader has of the WAL: what its cascaded replicas can get from it."""
    known = [lsn for lsn in (position.receive_lsn, position.replay_lsn) if lsn is not None]
    return max(known) if known else None


def _describe_change(change: RoleChange | None) -> str | None:
    if change is None:
        return None
    timeline = f" (timeline {change.timeline})" if change.timeline is not None else ""
    return f"{change.node}: {change.before} -> {change.after}{timeline}"


@fast_init
@dataclass(frozen=True)
class _ReplayPosition:
    lsn: int
    at: float
    source: str
    commits: Commits | None = None  # what commit timestamps say (only with the replica's own answer)


class ClusterTracker:
    def __init__(self, cluster: ClusterConfig, interval: float, window: float, horizon: float = 60.0) -> None:
        self.cluster = cluster
        self.interval = interval
        self.window = window
        self.horizon = horizon  # of the rates that forecasts divide by (catch-up, slot runway)
        self._generation = Progress(horizon)  # the primary's current LSN
        self._replayed: dict[str, Progress] = {}  # replica -> its replay LSN
        self._slot_restart: dict[str, Progress] = {}  # slot -> current LSN minus what it retains
        self.clock = LsnClock(_CLOCK_MAX_POINTS)
        self._window_samples = math.ceil(window / interval) * 2 + 16
        self._windows: dict[str, LagWindow] = {}
        self._histograms: dict[str, LagHistogram] = {}
        self._last_replay: dict[str, int] = {}
        self._last_seen: dict[str, float] = {}
        self._counters: dict[str, _NodeCounters] = {}
        self._xacts: deque[tuple[float, float]] = deque()
        self._inspect = [0, 0, 0, 0]  # inspected, skipped, fpi, record bytes
        self._last_inspection = (0, 0)  # fpi and inspected bytes of the last inspection
        self._compressed: dict[str, tuple[int, int, int]] = {}  # method -> images, stored, raw bytes
        self.roles = RoleTracker(cluster.name, cluster.standby_cluster)
        self._fork: Fork | None = None  # the promotion the set below is about
        self._followed_since_fork: set[str] = set()  # replicas seen following the new primary since
        self._sync_error: str | None = None  # the last synchronous_standby_names parse error said

    def update(self, observations: Sequence[NodeObservation], now: float) -> ClusterSnapshot:
        by_node = {o.node: o for o in observations}
        self.roles.standby_cluster = self.cluster.standby_cluster  # a reload or discovery may change it
        roles = self.roles.observe(observations)
        primary = roles.primary
        primary_ok = primary is not None and primary.position is not None
        standby = roles.standby_leader is not None  # primary is the standby leader, in recovery
        primary_lsn = None
        if roles.changed:
            # Another server's counters: rates over both would mean nothing.
            self._xacts.clear()
            self._forget_rates()
        if primary_ok:
            assert primary is not None and primary.position is not None
            primary_lsn = primary.position.current_lsn if not standby else _received(primary.position)
            if primary_lsn is not None:
                latest = self.clock.latest_lsn
                if latest is not None and primary_lsn < latest:
                    self._went_back(primary_lsn, latest, roles.fork)
                self.clock.record(primary_lsn, primary.observed_at, primary.asked_at)
                self._generation.add(primary.observed_at, primary_lsn)
            if not standby:  # a standby's transactions are its readers', not the writes to replicate
                self._note_xacts(primary.observed_at, primary.position.xacts_total)
        senders = {s.application_name: s for s in primary.walsenders} if primary_ok and primary else {}
        # The primary's view of a replica is as of the primary's answer, not of the cycle's end.
        senders_at = (primary.asked_at or primary.observed_at) if primary_ok and primary else now
        primary_clock = None
        if primary_ok and primary is not None:
            primary_clock = _PrimaryClock.of_standby_leader(primary) if standby else _PrimaryClock.of(primary)
        commit_times = {r.name: _last_commit_at(by_node.get(r.name), primary_clock) for r in self.cluster.replicas}
        known = [t for t in commit_times.values() if t is not None]
        # In a standby cluster how often its primary commits is not known (its transaction
        # counters are out of reach): a commit's age then only caps an interpolation, and
        # a newer commit elsewhere says nothing (Commits with neither never over-reads).
        newest_commit = max(known) if known and not standby else None
        interval = self._commit_interval() if not standby else 0.0

        # A configured replica that now accepts writes is a primary, not a replica that lags.
        replicas = [self._configured_replica(r.name, r.walsender_name, by_node.get(r.name), senders, senders_at,
                                             Commits(commit_times[r.name], newest_commit, interval), now, roles,
                                             primary_lsn)
                    for r in self.cluster.replicas if by_node.get(r.name) is None
                    or by_node[r.name].observed_role != "primary"]
        configured_names = {r.walsender_name for r in self.cluster.replicas}
        configured_labels = {r.name for r in self.cluster.replicas}
        for name in sorted(set(senders) - configured_names):
            # A walsender named like a configured replica (that replica matched by another
            # application_name) must not share its series nor its window.
            label = f"{name} (not configured)" if name in configured_labels else name
            replicas.append(self._unconfigured_replica(label, senders[name], senders_at, now, primary_lsn))
        self._forget_vanished({r.name for r in replicas}, now)
        slots = primary.slots if primary_ok and primary else ()
        runways = self._runways(slots, primary_lsn, primary.observed_at if primary_ok and primary else now)

        walinspect = self._walinspect(primary) if primary_ok else None
        return ClusterSnapshot(
            name=self.cluster.name,
            primary_lsn=primary_lsn,
            wal_rate_bytes_per_second=self._generation.rate(),
            replicas=tuple(replicas),
            slots=slots,
            slot_runways=runways,
            wal=primary.wal if primary_ok and primary else None,
            wal_dir=primary.wal_dir if primary_ok and primary else None,
            walinspect=walinspect,
            nodes=tuple(self._health(o, roles) for o in observations),
            slas=self.cluster.replica_slas,
            min_replicas=self.cluster.sla.min_replicas,
            primaries=roles.primaries,
            primary_node=primary.node if primary is not None else None,
            writer_member=writer_member(primary, observations),
            sync=self._sync(primary, by_node) if primary_ok and not standby else None,
            timeline=roles.timeline,
            role_changes_total=roles.role_changes_total,
            last_role_change=_describe_change(roles.last_change),
            last_role_change_ago=max(0.0, now - roles.last_change.at) if roles.last_change is not None else None,
        )

    def _sync(self, primary: NodeObservation | None, by_node: dict[str, NodeObservation]) -> SyncReplication | None:
        if primary is None or primary.position is None or primary.position.sync_standby_names is None:
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

    # -- replicas -------------------------------------------------------------------------

    def _configured_replica(self, name: str, walsender_name: str, obs: NodeObservation | None,
                            senders: dict[str, WalSender], senders_at: float, commits: Commits,
                            now: float, roles: RoleView, primary_lsn: int | None) -> ReplicaState:
        sender = senders.get(walsender_name)
        own = obs.position if obs is not None and obs.ok and obs.position is not None else None
        if own is not None and own.in_recovery and own.replay_lsn is not None:
            assert obs is not None
            replay: _ReplayPosition | None = _ReplayPosition(own.replay_lsn, obs.asked_at or obs.observed_at,
                                                             "replica", commits)
        else:
            replay = self._replay_from_sender(name, sender, senders_at)
        follows = _follows_primary(sender, obs, roles)
        if roles.fork != self._fork:
            self._fork, self._followed_since_fork = roles.fork, set()
        if follows:
            self._followed_since_fork.add(name)
        if (replay is not None and roles.fork is not None and name not in self._followed_since_fork
                and replay.lsn > roles.fork.lsn):
            # Left on the old timeline after a promotion (it has not followed the new primary
            # since): what it replayed past the fork is not the new primary's WAL. It lacks
            # everything since, and that keeps growing. One that did follow and only lost its
            # connection later is not held back to the fork.
            replay = _ReplayPosition(roles.fork.lsn, replay.at, replay.source)
        receiver = obs.receiver if obs is not None and obs.ok else None
        streaming: bool | None
        if receiver is not None:
            streaming = receiver.streaming
        elif sender is not None and sender.state is not None:
            # Not reachable ourselves, or its receiver view not readable: the primary's view.
            streaming = sender.state == "streaming"
        elif sender is not None or (obs is not None and obs.ok and obs.views.get("wal_receiver") is False):
            streaming = None  # both views hidden from this role (no pg_read_all_stats): unknown
        else:
            streaming = False
        return ReplicaState(
            name=name,
            configured=True,
            node_up=obs.ok if obs is not None else False,
            walsender=sender,
            streaming=streaming,
            receive_lsn=own.receive_lsn if own else None,
            receive_replay_bytes=own.receive_replay_bytes if own else None,
            replay_pause_state=own.replay_pause_state if own else None,
            last_replay_age_seconds=own.last_replay_age_seconds if own else None,
            wal_receiver_status=receiver.status if receiver else None,
            follows_primary=follows,
            **self._lag_fields(name, replay, sender, now, primary_lsn),
        )

    def _unconfigured_replica(self, name: str, sender: WalSender, senders_at: float, now: float,
                              primary_lsn: int | None) -> ReplicaState:
        return ReplicaState(
            name=name,
            configured=False,
            node_up=None,
            walsender=sender,
            streaming=sender.state == "streaming",
            **self._lag_fields(name, self._replay_from_sender(name, sender, senders_at), sender, now,
                               primary_lsn),
        )

    def _replay_from_sender(self, name: str, sender: WalSender | None, at: float) -> _ReplayPosition | None:
        if sender is not None and sender.replay_lsn is not None:
            return _ReplayPosition(sender.replay_lsn, at, "primary")
        if name in self._last_replay:
            # Nobody can tell us where it is now; it is at least as far behind as when we
            # last knew, and that keeps growing while the primary writes.
            return _ReplayPosition(self._last_replay[name], at, "last_known")
        return None

    def _lag_fields(self, name: str, replay: _ReplayPosition | None, sender: WalSender | None,
                    now: float, primary_lsn: int | None) -> _LagFields:
        window = self._windows.setdefault(name, LagWindow(self.window, self._window_samples))
        histogram = self._histograms.setdefault(name, LagHistogram())
        self._last_seen[name] = now
        reading = None
        if replay is not None:
            self._last_replay[name] = replay.lsn
            reading = self.clock.estimate(replay.lsn, replay.at, replay.commits)
            if reading is not None and reading.evidence == "history_start" and sender is not None:
                # Our history starts after the primary passed this replay LSN (lagwatch just
                # started, or the clock restarted): the clock only knows a lower bound. The
                # walsender's replay_lag, measured by the primary, is a better floor (no
                # higher than the replayed commit's age, which bounds it from above).
                floor = sender.lag_seconds("replay") or 0.0
                if replay.commits is not None and replay.commits.last_replayed is not None:
                    floor = min(floor, replay.at - replay.commits.last_replayed)
                if floor > reading.seconds:
                    reading = Staleness(floor, "walsender")
        if reading is not None and replay is not None:
            window.add(replay.at, reading.seconds)
            histogram.observe(reading.seconds)
        return {
            "staleness": reading.seconds if reading is not None else None,
            "staleness_source": replay.source if replay is not None and reading is not None else None,
            "staleness_evidence": reading.evidence if reading is not None else None,
            "staleness_at": replay.at if replay is not None and reading is not None else None,
            "replay_lsn": replay.lsn if replay is not None else None,
            "window": window.stats(now),
            "histogram": histogram.snapshot(),
            "samples": window.samples(now),
            "catch_up": self._catch_up(name, replay.lsn if replay is not None else None,
                                       replay.at if replay is not None and reading is not None else None,
                                       primary_lsn, now),
        }

    def _went_back(self, now_lsn: int, before_lsn: int, fork: Fork | None) -> None:
        """The primary's LSN went backwards: a failover to a replica that had not received
        everything, or a restore. The history up to the new position (or the fork, where a
        promotion was seen) is shared and keeps its times; past it, it was never this
        primary's, and keeping it would make caught-up replicas look stale."""
        cut = min(now_lsn, fork.lsn) if fork is not None else now_lsn
        log.warning("%s: the primary's WAL position went back from %s to %s (failover or restore?); "
                    "forgetting the LSN history past %s", self.cluster.name, format_lsn(before_lsn),
                    format_lsn(now_lsn), format_lsn(cut))
        self.clock.truncate(cut)
        self._last_replay = {name: min(lsn, cut) for name, lsn in self._last_replay.items()}
        self._xacts.clear()
        self._forget_rates()

    def _forget_rates(self) -> None:
        self._generation.clear()
        self._replayed.clear()
        self._slot_restart.clear()

    # -- forecasts ------------------------------------------------------------------------

    def _catch_up(self, name: str, replay_lsn: int | None, replay_at: float | None, primary_lsn: int | None,
                  now: float) -> CatchUp | None:
        """A replica's replay rate, backlog and catch-up ETA: the rate since replay last
        stood still (after a pause, how fast it replays now), against the primary's WAL
        generation rate, both over the forecast horizon."""
        if replay_lsn is None or primary_lsn is None:
            return None
        progress = self._replayed.setdefault(name, Progress(self.horizon))
        progress.add(replay_at or now, replay_lsn)
        backlog = max(0, primary_lsn - replay_lsn)
        return catch_up(backlog, progress.rate_since_stall(), self._generation.rate(), within=self.interval)

    def _runways(self, slots: Sequence[Slot], primary_lsn: int | None, at: float) -> dict[str, float]:
        """Seconds until each limited slot's safe_wal_size reaches 0 at the current net rate
        (WAL written minus WAL the consumer lets go); +inf when it does not shrink."""
        out: dict[str, float] = {}
        for slot in slots:
            if primary_lsn is None or slot.retained_bytes is None:
                continue
            progress = self._slot_restart.setdefault(slot.name, Progress(self.horizon))
            progress.add(at, primary_lsn - slot.retained_bytes)
            generation, released = self._generation.rate(), progress.rate()
            if slot.safe_wal_size is None or generation is None or released is None:
                continue
            left = runway(slot.safe_wal_size, generation - released)
            if left is not None:
                out[slot.name] = left
        if primary_lsn is not None:  # a primary that did not answer this cycle dropped no slot
            for name in set(self._slot_restart) - {s.name for s in slots}:
                del self._slot_restart[name]  # a dropped slot
        return out

    def _forget_vanished(self, present: set[str], now: float) -> None:
        # A replica that stopped streaming drops out of the output at once; its history is
        # kept one window in case it comes back, then dropped so memory stays bounded.
        for name in [n for n, seen in self._last_seen.items() if n not in present and seen < now - self.window]:
            for table in (self._windows, self._histograms, self._last_replay, self._last_seen, self._replayed):
                table.pop(name, None)

    # -- cluster-wide ---------------------------------------------------------------------

    def _note_xacts(self, at: float, total: float | None) -> None:
        if total is None or (self._xacts and total < self._xacts[-1][1]):
            self._xacts.clear()  # unknown, or the statistics were reset
        if total is not None:
            self._xacts.append((at, total))
        while self._xacts and self._xacts[0][0] < at - _XACT_HORIZON_SECONDS:
            self._xacts.popleft()

    def _commit_interval(self) -> float:
        """The primary's time between transactions lately (0 when unknown): the shortest
        mean over the spans that end at the last poll. Read-only transactions count too, so
        it is never longer than the time between commits that write; and the shortest span
        that shows the current rate wins, so a stream that just began after an idle spell
        is not taken for as sparse as the spell (a longer mean there would be subtracted
        from the commit estimate and read the lag low)."""
        if len(self._xacts) < 2:
            return 0.0
        t1, n1 = self._xacts[-1]
        best = 0.0
        for t0, n0 in self._xacts:
            if t1 - t0 < _XACT_MIN_SPAN_SECONDS:
                break
            if n1 > n0:
                interval = (t1 - t0) / (n1 - n0)
                best = interval if best == 0.0 else min(best, interval)
        return best

    def _walinspect(self, primary: NodeObservation | None) -> WalInspectTotals | None:
        if primary is None:
            return None
        inspection = primary.walinspect
        if inspection is not None:
            self._last_inspection = (inspection.fpi_bytes, inspection.inspected_bytes)
            for i, value in enumerate((inspection.inspected_bytes, inspection.skipped_bytes,
                                       inspection.fpi_bytes, inspection.record_bytes)):
                self._inspect[i] += value
            for c in inspection.compressed or ():
                images, stored, raw = self._compressed.get(c.method, (0, 0, 0))
                self._compressed[c.method] = (images + c.images, stored + c.stored_bytes, raw + c.raw_bytes)
        elif not any(self._inspect):
            return None
        return WalInspectTotals(
            inspected_bytes=self._inspect[0],
            skipped_bytes=self._inspect[1],
            fpi_bytes=self._inspect[2],
            record_bytes=self._inspect[3],
            last_interval_fpi_bytes=self._last_inspection[0],
            last_interval_bytes=self._last_inspection[1],
            compressed=dict(self._compressed),
        )

    def _say_state_change(self, obs: NodeObservation, counters: _NodeCounters) -> None:
        """One line of lagwatch's own when a node goes down (with why) and when it is back:
        the library's own messages about a lost connection say neither which node nor what
        it means."""
        if obs.ok == counters.up or (obs.ok and counters.up is None):
            counters.up = obs.ok
            return
        where = f"{self.cluster.name}/{obs.node}"
        if obs.ok:
            down_for = obs.observed_at - counters.down_since if counters.down_since is not None else None
            log.info("%s: up again%s", where, f" after {format_duration(down_for)} down" if down_for else "")
            counters.down_since = None
        else:
            log.warning("%s: down: %s (%s)", where, obs.error or "no answer", obs.error_kind)
            counters.down_since = obs.observed_at
        counters.up = obs.ok

    def _health(self, obs: NodeObservation, roles: RoleView) -> NodeHealth:
        counters = self._counters.setdefault(obs.node, _NodeCounters())
        counters.polls += 1
        counters.connects = max(counters.connects, obs.connects_total)
        if obs.error_kind is not None:
            counters.errors[obs.error_kind] = counters.errors.get(obs.error_kind, 0) + 1
        self._say_state_change(obs, counters)
        caps = obs.capabilities
        return NodeHealth(
            name=obs.node,
            role=obs.role,
            up=obs.ok,
            version_num=caps.version_num if caps else None,
            poll_duration=obs.duration,
            polls_total=counters.polls,
            errors_total=dict(counters.errors),
            last_error=obs.error,
            skipped=caps.skipped if caps else {},
            views=dict(obs.views),
            view_errors_total=dict(obs.view_errors_total),
            observed_role=roles.role_of(obs),
            timeline=obs.timeline,
            connects_total=counters.connects,
        )


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
