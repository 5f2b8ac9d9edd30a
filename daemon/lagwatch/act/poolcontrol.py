"""Pool control for one cluster: decide from the snapshot, apply through the pooler.

A cycle runs every controller in three steps, so that the clusters with nothing to do
cost no task, no thread and no round trip: ``read_back`` (only when due: at start, every
``read_back_every`` seconds of the adapter, sooner after a failed read; so a restarted
HAProxy or an edited file is seen), ``decide`` (the pure policy, every change logged and
counted; returns what to apply if this instance leads and the pooler differs), and
``apply``. Leadership (leader.py) and the operator holds come in as arguments: the
daemon looks them up once per server and once per cycle, not per cluster. A failing read
or apply is counted, retried with backoff and never stops the cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from lagwatch.act.holds import Hold, Holds, HoldsError, HoldStore
from lagwatch.act.leader import Standing
from lagwatch.act.policy import Decision, PolicyState, PoolRules, ReplicaHealth, decide, route_to_current_primary
from lagwatch.config import ClusterConfig, PasswordUnavailableError
from lagwatch.durations import format_duration
from lagwatch.estimate.snapshot import ClusterSnapshot, PoolEvent, PoolStatus
from lagwatch.poolers import make_pooler
from lagwatch.poolers.base import PRIMARY, NeverAppliedError, Pooler, PoolerError, backends_from_cluster

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
    timeout: float
    pooler: Pooler


class PoolController:
    def __init__(self, cluster: ClusterConfig, interval: float, timeout: float) -> None:
        assert cluster.pooler is not None
        self.cluster = cluster
        self.interval = interval
        self.pooler: Pooler = make_pooler(cluster)
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
        self._read_at = 0.0  # monotonic time the pooler's view is read back next
        self._read_failures = 0
        self._unknown_why: str | None = None  # why the first read could not tell the pool (no failure)
        self._led = False  # whether this instance led at the last decision
        self._standing = Standing(False, None)
        self._decision: Decision | None = None
        self._holds_now: dict[str, Hold] = {}

    def prepare(self, cluster: ClusterConfig, interval: float, timeout: float) -> Reconfiguration | None:
        """What a reloaded config changes here, built without touching this controller
        (``commit`` puts it in force). None when the pooler itself changed: then this
        controller is retired and a fresh one starts."""
        if cluster.pooler != self.cluster.pooler or cluster.name != self.cluster.name:
            return None
        return Reconfiguration(cluster, interval, timeout, make_pooler(cluster))

    def commit(self, change: Reconfiguration) -> None:
        """Take a reloaded config without forgetting: streaks, events, counters and backoff
        carry over, so a reload does not reset hysteresis (leadership is the daemon's, kept
        per primary server: leader.py)."""
        cluster = change.cluster
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
        self.cluster, self.interval, self._names = cluster, change.interval, names
        self.deadline = max(3.0, 2 * change.timeout)
        self._read_at = 0.0  # the new adapter's view, read at the next step

    # -- 1. the pooler's own view, when due ------------------------------------------------

    def read_due(self, now: float, standing: Standing) -> bool:
        """At start, when the period is up, when this instance has just become the leader
        (the pool it read while another instance led is stale), and before retrying a failed
        apply (a pooler back up is then seen answering, and the retry goes out without its
        backoff)."""
        return (self._state is None or now >= self._read_at
                or (bool(standing.leads) and not self._led and not self.cluster.dry_run)
                or (bool(self._backoff.failures) and time.monotonic() >= self._backoff.next_at))

    async def read_back(self, now: float) -> None:
        try:
            self._pooler_view = await self._call(self.pooler.read_pool)
            if self._read_failing and self._backoff.failures:
                # The pooler answers again: the pending change goes out now, not after the backoff.
                log.info("%s: %s answers again; applying without waiting", self.cluster.name, self.pooler.kind)
                self._backoff = _ApplyBackoff()
            self._read_failing = False
            self._read_failures = 0
            # Spread over the period, so that a fleet's controllers do not all read in one cycle.
            wait = self.pooler.read_back_every * (0.5 + 0.5 * random.random())
        except NeverAppliedError as exc:
            # A fresh start: unknown until the first apply (the leader's, at once), no failure.
            self._pooler_view = None
            self._unknown_why = str(exc)
            wait = self.pooler.read_back_every * (0.5 + 0.5 * random.random())
        except PoolerError as exc:
            self._pooler_view = None
            self._read_failing = True
            self._read_errors += 1
            self._read_failures += 1
            self._note_error(f"reading the pool: {exc}")
            # Sooner after a failure (a pooler back up is seen at once), backing off to the period.
            wait = min(self.pooler.read_back_every, self.interval * 2 ** (self._read_failures - 1))
        self._read_at = now + wait

    async def step(self, snapshot: ClusterSnapshot, now: float, standing: Standing, holds: Holds | HoldsError,
                   may_apply: bool = True) -> PoolStatus | None:
        """One cycle of this cluster alone: the three steps in order (the daemon runs each
        step across its clusters at once)."""
        if self.read_due(now, standing):
            await self.read_back(now)
        planned = self.decide(snapshot, now, standing, holds, may_apply)
        if planned is not None:
            await self.apply(*planned)
        return self.status()

    # -- 2. the decision -------------------------------------------------------------------

    def decide(self, snapshot: ClusterSnapshot, now: float, standing: Standing, holds: Holds | HoldsError,
               may_apply: bool = True) -> tuple[frozenset[str], frozenset[str]] | None:
        """This cycle's decision (logged and counted). Returns the members to apply and
        what the pooler will route to then, if this instance leads (``standing``), may
        apply (not stopping), and the pooler differs; else None."""
        is_leader = bool(standing.leads) and not self.cluster.dry_run
        self._standing, self._led = standing, is_leader
        if self._state is None:
            if self._pooler_view is not None:
                start = self._pooler_view
                log.info("%s: pool starts as the pooler has it: %s", self.cluster.name,
                         ", ".join(sorted(start)) or "(empty)")
            else:
                # Unknown (pooler down, or a command adapter that never applied): start with
                # every replica in and let the policy and the next apply converge.
                start = frozenset(self._names)
                log.info("%s: the pooler's pool is unknown (%s); starting with every replica in", self.cluster.name,
                         self._unknown_why or self._last_error or "?")
            self._state = PolicyState.from_pool(start, self._names, now)
            self._applied = self._pooler_view

        holds_now = self._holds(holds)
        decision = decide(self._health(snapshot), {n: self.cluster.replica_sla(n) for n in self._names},
                          PoolRules(self.cluster.sla.min_replicas, self.cluster.sla.fallback_to_primary,
                                    self.cluster.sla.primary_in_read_pool),
                          self._state, holds_now, now, [r.name for r in self.cluster.replicas if not r.read_pool])
        self._state, self._decision, self._holds_now = decision.state, decision, holds_now
        self._record(decision, snapshot, is_leader)
        if not (is_leader and may_apply) or time.monotonic() < self._backoff.next_at:
            return None
        routed = route_to_current_primary(decision.pool, snapshot.writer_member, self._names,
                                          primary_routable=PRIMARY not in decision.pool
                                          or PRIMARY in backends_from_cluster(self.cluster))
        target = None if routed is None else self.pooler.routes_for(routed, self._pooler_view)
        if routed is None or target is None or not self._needs_apply(target):
            return None
        return routed, target

    # -- 4. what the cycle publishes -------------------------------------------------------

    def status(self) -> PoolStatus | None:
        """The pool as of the last decision (None before the first)."""
        if self._decision is None:
            return None
        return self._status(bool(self._standing.leads) and not self.cluster.dry_run, self._decision, self._holds_now)

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

    def _holds(self, holds: Holds | HoldsError) -> dict[str, Hold]:
        if isinstance(holds, HoldsError):
            # A half-edited or corrupt holds file: keep the holds last read, so a replica an
            # operator holds out is not readmitted by automation meanwhile.
            self._note_error(f"{holds}; keeping the holds last read")
            return self._last_holds
        mine = holds.get(self.cluster.name)
        self._last_holds = {r: h for r, h in mine.items() if r in self._names} if mine else {}
        return self._last_holds

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
                why = f"{r.diagnosis.cause}: {r.diagnosis.detail}" if r.diagnosis is not None else ""
                out.append(ReplicaHealth(name, r.staleness, bool(r.node_up), r.streaming is not False, r.samples,
                                         follows_primary=r.follows_primary, why=why))
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
        holder = self._standing.holder
        if holder is None:
            return " (not applied here: this instance could not take the leader lock)"
        if holder.is_lagwatch:
            return f" (not applied here: the leader, another lagwatch instance, applies it; {holder.describe()})"
        return f" (NOT APPLIED: the leader lock is held by a session that is not lagwatch: {holder.describe()})"

    # -- 3. making the pooler match ---------------------------------------------------------

    async def apply(self, members: frozenset[str], target: frozenset[str]) -> None:
        """Apply ``members`` (``decide``'s answer), then take ``target`` as the pooler's view:
        every adapter reads its own view back after a change before it returns."""
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
            leader_holder=self._standing.holder,
        )


def _fmt(value: float | None) -> str:
    return "?" if value is None else format_duration(value)


async def control_all(fresh: Iterable[ClusterSnapshot], controllers: Mapping[str, PoolController],
                      standing_of: Callable[[str], Standing], holds_store: HoldStore, now: float,
                      may_apply: bool = True) -> dict[str, PoolStatus | None]:
    """Pool control for the clusters tracked from this cycle's answers: the pooler's views
    that are due read back, every decision, then every apply, each step's I/O concurrent
    across clusters (so a cluster with nothing to do costs no task and no thread). A
    cluster whose leadership is not known this cycle (its lock session's answer came
    late) decides nothing, like a carried one. The holds file is looked at once. A
    stopping daemon (``may_apply`` false) decides but applies nothing. Returns each
    controlled cluster's pool as of its last decision."""
    controlled = [(cluster, controllers[cluster.name]) for cluster in fresh if cluster.name in controllers]
    steps = [(cluster, controller, standing) for cluster, controller in controlled
             if (standing := standing_of(cluster.name)).leads is not None or controller.cluster.dry_run]
    if steps:
        holds: Holds | HoldsError
        try:
            holds = holds_store.current()
        except HoldsError as exc:
            holds = exc
        await asyncio.gather(*(controller.read_back(now) for _, controller, standing in steps
                               if controller.read_due(now, standing)))
        applies = []
        for cluster, controller, standing in steps:
            try:
                planned = controller.decide(cluster, now, standing, holds, may_apply)
            except Exception:  # pool control must never stop the measuring
                log.exception("%s: pool control failed; measuring goes on", cluster.name)
                continue
            if planned is not None:
                applies.append(controller.apply(*planned))
        await asyncio.gather(*applies)
    return {cluster.name: controller.status() for cluster, controller in controlled}
