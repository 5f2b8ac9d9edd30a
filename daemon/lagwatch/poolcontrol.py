"""Pool control for one cluster: decide from the snapshot, apply through the pooler.

Each cycle: read the pooler's own view (so a restarted HAProxy or an edited file is seen),
take or keep the leader lock (a dry run never takes it: a trial instance must not keep
the real one from applying), run the pure policy, log and count every change, and, if
this instance leads, make the pooler match the decision when it differs. A failing read
or apply is counted, retried with backoff and never stops the cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from lagwatch.config import ClusterConfig, PasswordUnavailableError
from lagwatch.conninfo import serves_as
from lagwatch.durations import format_duration
from lagwatch.holds import Hold, HoldsError, HoldStore
from lagwatch.leader import LeaderLock
from lagwatch.policy import Decision, PolicyState, PoolRules, ReplicaHealth, decide, route_to_current_primary
from lagwatch.poolers import make_pooler
from lagwatch.poolers.base import PRIMARY, Pooler, PoolerError, backends_from_cluster
from lagwatch.snapshot import ClusterSnapshot, PoolEvent, PoolStatus

log = logging.getLogger("lagwatch.pool")

T = TypeVar("T")
MAX_EVENTS = 50
APPLY_BACKOFF_MAX = 30.0


@dataclass
class _ApplyBackoff:
    failures: int = 0
    next_at: float = 0.0


@dataclass(frozen=True)
class Reconfiguration:
    """A reloaded cluster config for a running PoolController, built beside it."""

    cluster: ClusterConfig
    interval: float
    holds: HoldStore
    timeout: float
    pooler: Pooler
    leader: LeaderLock | None  # a new lock when the primary or the timeout changed


class PoolController:
    def __init__(self, cluster: ClusterConfig, interval: float, holds: HoldStore, timeout: float) -> None:
        assert cluster.pooler is not None
        self.cluster = cluster
        self.interval = interval
        self.holds = holds
        self.pooler: Pooler = make_pooler(cluster)
        self.leader = LeaderLock(cluster, timeout)
        self._state: PolicyState | None = None
        self._applied: frozenset[str] | None = None  # the last pool this instance applied
        self._pooler_view: frozenset[str] | None = None
        self._read_failing = False
        self._events: deque[PoolEvent] = deque(maxlen=MAX_EVENTS)
        self._changes: Counter[tuple[str, str]] = Counter()
        self._apply_errors = 0
        self._read_errors = 0
        self._last_holds: dict[str, Hold] = {}
        self._last_error: str | None = None
        self._backoff = _ApplyBackoff()
        self._names = [r.name for r in cluster.replicas]
        self._inflight: asyncio.Future[Any] | None = None
        self.deadline = max(3.0, 2 * timeout)

    def prepare(self, cluster: ClusterConfig, interval: float, holds: HoldStore,
                timeout: float) -> Reconfiguration | None:
        """What a reloaded config changes here, built without touching this controller
        (``commit`` puts it in force). None when the pooler itself changed: then this
        controller is retired and a fresh one starts."""
        if cluster.pooler != self.cluster.pooler or cluster.name != self.cluster.name:
            return None
        # The lock's session may stay when only the writer's host list changed (discovery:
        # a member joined or left) and the server it is on is still listed: re-taking it
        # would hand leadership to the other instance for nothing.
        new_leader = (not serves_as(self.cluster.primary, cluster.primary, self.leader.connected_address())
                      or timeout != self.leader.timeout or cluster.leader_lock_key != self.cluster.leader_lock_key)
        return Reconfiguration(cluster, interval, holds, timeout, make_pooler(cluster),
                               LeaderLock(cluster, timeout) if new_leader else None)

    def commit(self, change: Reconfiguration) -> None:
        """Take a reloaded config without forgetting: streaks, events, counters, backoff and
        (if the primary is the same) the leader lock carry over, so a reload neither resets
        hysteresis nor hands leadership to the other instance."""
        cluster = change.cluster
        if change.leader is not None:
            self.leader.release()
            self.leader = change.leader
        else:
            self.leader.cluster = cluster
        self.pooler = change.pooler  # the replicas' hosts and ports may have changed
        names = [r.name for r in cluster.replicas]
        if self._state is not None:
            # A replica new to the config must earn its place, as at start, unless the
            # pooler already routes to it. Replicas no longer configured fall out of the
            # pool through the policy ("no longer configured").
            view = self._pooler_view or frozenset()
            new_names = [n for n in names if n not in self._state.replicas]
            joined = PolicyState.from_pool(view & set(new_names), new_names, time.monotonic())
            self._state = PolicyState({**self._state.replicas, **joined.replicas}, self._state.pool | joined.pool)
        self.cluster, self.interval, self.holds, self._names = cluster, change.interval, change.holds, names
        self.deadline = max(3.0, 2 * change.timeout)

    async def step(self, snapshot: ClusterSnapshot, now: float) -> PoolStatus:
        if self.cluster.dry_run:
            self.leader.release()
            is_leader = False
        else:
            is_leader = await self.leader.refresh()
        try:
            self._pooler_view = await self._call(self.pooler.read_pool)
            if self._read_failing and self._backoff.failures:
                # The pooler answers again: the pending change goes out now, not after the backoff.
                log.info("%s: %s answers again; applying without waiting", self.cluster.name, self.pooler.kind)
                self._backoff = _ApplyBackoff()
            self._read_failing = False
        except PoolerError as exc:
            self._pooler_view = None
            self._read_failing = True
            self._read_errors += 1
            self._note_error(f"reading the pool: {exc}")
        if self._state is None:
            if self._pooler_view is not None:
                start = self._pooler_view
                log.info("%s: pool starts as the pooler has it: %s", self.cluster.name,
                         ", ".join(sorted(start)) or "(empty)")
            else:
                # Unknown (pooler down, or a command adapter that never applied): start with
                # every replica in and let the policy and the next apply converge.
                start = frozenset(self._names)
                log.info("%s: the pooler's pool is unknown; starting with every replica in", self.cluster.name)
            self._state = PolicyState.from_pool(start, self._names, now)
            self._applied = self._pooler_view

        holds = self._holds()
        decision = decide(self._health(snapshot), {n: self.cluster.replica_sla(n) for n in self._names},
                          PoolRules(self.cluster.sla.min_replicas, self.cluster.sla.fallback_to_primary,
                                    self.cluster.sla.primary_in_read_pool),
                          self._state, holds, now, [r.name for r in self.cluster.replicas if not r.read_pool])
        self._state = decision.state
        self._record(decision, snapshot, is_leader)
        if is_leader and not self.cluster.dry_run:
            routed = route_to_current_primary(decision.pool, snapshot.writer_member, self._names,
                                              primary_routable=PRIMARY not in decision.pool
                                              or PRIMARY in backends_from_cluster(self.cluster))
            target = None if routed is None else self.pooler.routes_for(routed, self._pooler_view)
            if routed is not None and target is not None and self._needs_apply(target):
                await self._apply(routed, target)
        return self._status(is_leader, decision, holds)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking pooler call in a daemon thread with a deadline. A pooler that
        hangs (a frozen PgBouncer keeps its socket open) costs one deadline, after which
        pool control is skipped until the call returns: measuring never waits on it, and
        a stuck thread never keeps lagwatch from exiting."""
        if self._inflight is not None and not self._inflight.done():
            raise PoolerError(f"the previous {self.pooler.kind} call has not returned yet")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if not future.done():
                future.set_exception(error) if error is not None else future.set_result(result)

        def work() -> None:
            try:
                result, error = fn(*args), None
            except BaseException as exc:  # handed to the loop, which decides
                result, error = None, exc
            with contextlib.suppress(RuntimeError):  # the loop may be gone at shutdown
                loop.call_soon_threadsafe(settle, result, error)

        threading.Thread(target=work, name=f"lagwatch-pooler-{self.cluster.name}", daemon=True).start()
        self._inflight = future
        done, _ = await asyncio.wait({future}, timeout=self.deadline)
        if not done:
            raise PoolerError(f"{self.pooler.kind} did not answer within {self.deadline:.3g}s")
        try:
            return future.result()
        except PoolerError:
            raise
        except (OSError, PasswordUnavailableError) as exc:  # e.g. an unreadable admin password file
            raise PoolerError(str(exc)) from None
        except Exception as exc:  # a bug in an adapter: counted and retried like any failure
            log.exception("%s: unexpected error from the %s adapter", self.cluster.name, self.pooler.kind)
            raise PoolerError(f"internal error: {type(exc).__name__}") from None

    def _needs_apply(self, target: frozenset[str]) -> bool:
        """``target`` is what the pooler would route to once given the decided pool."""
        if self._pooler_view is not None:
            return self._pooler_view != target  # e.g. a restarted HAProxy forgot our changes
        # The pooler cannot be read right now: only push a change we have not applied yet.
        return target != self._applied

    def _holds(self) -> dict[str, Hold]:
        try:
            holds = {r: h for r, h in self.holds.for_cluster(self.cluster.name).items() if r in self._names}
        except HoldsError as exc:
            # A half-edited or corrupt holds file: keep the holds last read, so a replica an
            # operator holds out is not readmitted by automation meanwhile.
            self._note_error(f"{exc}; keeping the holds last read")
            return dict(self._last_holds)
        self._last_holds = holds
        return holds

    def _health(self, snapshot: ClusterSnapshot) -> list[ReplicaHealth]:
        by_name = {r.name: r for r in snapshot.replicas}
        writers = {n.name for n in snapshot.nodes if n.observed_role == "primary"}
        out = []
        for name in self._names:
            r = by_name.get(name)
            if name in writers:
                out.append(ReplicaHealth(name, None, True, False, promoted=True))
            elif r is None:
                out.append(ReplicaHealth(name, None, False, False))
            else:
                out.append(ReplicaHealth(name, r.staleness, bool(r.node_up), r.streaming is not False, r.samples,
                                         follows_primary=r.follows_primary))
        return out

    def _record(self, decision: Decision, snapshot: ClusterSnapshot, is_leader: bool) -> None:
        by_name = {r.name: r for r in snapshot.replicas}
        for change in decision.changes:
            replica = by_name.get(change.member)
            staleness = replica.staleness if replica else None
            p95 = replica.window.p95 if replica and replica.window else None
            self._changes[(change.member, change.action)] += 1
            event = PoolEvent(at=time.time(), member=change.member, action=change.action, reason=change.reason,
                              staleness=staleness, p95=p95, dry_run=self.cluster.dry_run)
            self._events.append(event)
            log.warning("pool change%s: cluster=%s replica=%s action=%s reason=%r staleness=%s p95=%s",
                        self._not_applied(is_leader), self.cluster.name,
                        change.member, change.action, change.reason, _fmt(staleness), _fmt(p95))

    def _not_applied(self, is_leader: bool) -> str:
        """Why this instance will not apply a decision it logs, or "" when it will."""
        if self.cluster.dry_run:
            return " (dry run, not applied)"
        if is_leader:
            return ""
        holder = self.leader.holder
        if holder is None:
            return " (not applied here: this instance could not take the leader lock)"
        if holder.is_lagwatch:
            return f" (not applied here: the leader, another lagwatch instance, applies it; {holder.describe()})"
        return f" (NOT APPLIED: the leader lock is held by a session that is not lagwatch: {holder.describe()})"

    async def _apply(self, members: frozenset[str], target: frozenset[str]) -> None:
        if time.monotonic() < self._backoff.next_at:
            return
        try:
            await self._call(self.pooler.apply_pool, members)
        except PoolerError as exc:
            self._apply_errors += 1
            self._backoff.failures += 1
            delay = min(APPLY_BACKOFF_MAX, self.interval * 2 ** (self._backoff.failures - 1))
            self._backoff.next_at = time.monotonic() + delay
            self._note_error(f"applying {sorted(members)}: {exc} (retry in {delay:.3g}s)")
            return
        self._backoff = _ApplyBackoff()
        self._pooler_view = self._applied = target
        self._last_error = None
        log.info("%s: %s pool is now %s", self.cluster.name, self.pooler.kind, ", ".join(sorted(target)))

    def _note_error(self, message: str) -> None:
        if message != self._last_error:
            log.error("%s: pooler %s: %s", self.cluster.name, self.pooler.kind, message)
        self._last_error = message

    def _status(self, is_leader: bool, decision: Decision | None, holds: dict[str, Hold]) -> PoolStatus:
        return PoolStatus(
            kind=self.pooler.kind,
            leader=is_leader,
            dry_run=self.cluster.dry_run,
            members=decision.pool if decision else None,
            pooler_members=self._pooler_view,
            reasons=dict(decision.reasons) if decision else {},
            holds={replica: str(hold) for replica, hold in holds.items()},
            changes_total=dict(self._changes),
            apply_errors_total=self._apply_errors,
            read_errors_total=self._read_errors,
            last_error=self._last_error,
            events=tuple(self._events),
            leader_holder=self.leader.holder,
        )

    async def close(self) -> None:
        await self.leader.close()


def _fmt(value: float | None) -> str:
    return "?" if value is None else format_duration(value)
