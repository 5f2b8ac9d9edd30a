"""Which replicas belong in the read pool: a pure function of what was observed.

``decide(replicas, slas, rules, state, overrides, now)`` returns the desired pool, the
changes against the previous decision with their reasons, and the next state. No I/O, no
clock: everything comes in as arguments, so the tests are tables.

Rules (hysteresis, so nothing flaps):
- a pool member is ejected after ``eject_after`` consecutive bad cycles: staleness above
  ``max_lag``, unknown, or the node unreachable / not streaming. Its p95 since it was
  (re)admitted above the SLA's ``p95`` ejects it at once;
- an ejected replica is readmitted after ``readmit_after`` consecutive cycles reachable,
  streaming and below ``readmit_below`` (and at or below ``p95`` where that is set, or a
  replica steadily between the two would be ejected again as soon as its p95 fills);
  "unknown" never counts as good;
- a replica that was promoted (it accepts writes) leaves at once; one that does not
  replicate from the current primary (left on the old timeline after a failover, or a
  demoted old primary not yet following) counts as a bad cycle and is never readmitted;
- an operator hold (in/out) beats all of the above;
- the pool never shrinks below ``min_replicas``: the least-behind ejected replicas stay
  (reachable and streaming ones first; one already kept stays unless another is less behind
  by more than its ``max_lag`` and by more than half, so two lagging replicas do not swap
  every cycle), or, with ``fallback_to_primary``, the primary joins while too few
  replicas are healthy;
- with ``primary_in_read_pool`` the primary is always in the pool beside the replicas
  (the node that accepts writes now: a promoted replica stays, as the primary).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from lagwatch.config import ReplicaSla
from lagwatch.durations import format_duration as _d
from lagwatch.estimate.windows import nearest_rank

PRIMARY = "primary"
# A p95 over fewer samples than this is just the max of a handful: not evidence.
MIN_P95_SAMPLES = 20

Hold = Literal["in", "out"]
Action = Literal["eject", "readmit", "add", "remove"]


@dataclass(frozen=True)
class ReplicaHealth:
    """One cycle's view of a configured replica, as the policy needs it."""

    name: str
    staleness: float | None
    reachable: bool
    streaming: bool
    samples: Sequence[tuple[float, float]] = ()  # (monotonic time, staleness) over the window (windows.LagSamples)
    promoted: bool = False  # it accepts writes now: a primary, not a replica to read from
    follows_primary: bool | None = None  # None: cannot tell this cycle (no primary answered)
    why: str = ""  # what holds its staleness back ("apply_delay: ..."; diagnosis.py), for the reasons given


@dataclass(frozen=True)
class PoolRules:
    min_replicas: int
    fallback_to_primary: bool
    primary_in_read_pool: bool = False


@dataclass(frozen=True)
class ReplicaPolicyState:
    eligible: bool  # by the SLA alone (before holds and min_replicas)
    bad_streak: int = 0
    good_streak: int = 0
    admitted_at: float = -math.inf  # p95 counts samples since then
    reason: str = ""  # why it is out (or was last judged)


@dataclass(frozen=True)
class PolicyState:
    replicas: Mapping[str, ReplicaPolicyState] = field(default_factory=dict)
    pool: frozenset[str] = frozenset()

    @classmethod
    def from_pool(cls, pool: frozenset[str], names: Sequence[str], now: float) -> PolicyState:
        """Start from what the pooler routes to now: members are eligible, the others
        must earn their way back in."""
        return cls({n: ReplicaPolicyState(eligible=n in pool, admitted_at=now,
                                          reason="" if n in pool else "not in the pool at start")
                    for n in names}, frozenset(pool))


@dataclass(frozen=True)
class PoolChange:
    member: str
    action: Action
    reason: str


@dataclass(frozen=True)
class Decision:
    pool: frozenset[str]
    changes: tuple[PoolChange, ...]
    state: PolicyState
    reasons: Mapping[str, str]  # every replica's current standing, for logs and /status


def p95_since(samples: Sequence[tuple[float, float]], since: float) -> float | None:
    values = sorted(v for t, v in samples if t >= since)
    if len(values) < MIN_P95_SAMPLES:
        return None
    return nearest_rank(values, 0.95)


def _problem(health: ReplicaHealth) -> str:
    """What, if anything, makes this cycle a bad one whatever the SLA."""
    if not health.reachable:
        return "unreachable"
    if not health.streaming:
        return "not streaming"
    if health.follows_primary is False:
        return "not replicating from the current primary"
    if health.staleness is None:
        return "staleness unknown"
    return ""


def _why(health: ReplicaHealth) -> str:
    return f" ({health.why})" if health.why else ""


def _judge(health: ReplicaHealth, sla: ReplicaSla, prev: ReplicaPolicyState, now: float) -> ReplicaPolicyState:
    if health.promoted:
        # Out at once, not after eject_after cycles: it is no replica now. Should it be
        # demoted and follow again, it earns its way back like any ejected replica.
        return ReplicaPolicyState(eligible=False, reason="promoted: it accepts writes now")
    judge = _judge_member if prev.eligible else _judge_outsider
    return judge(health, sla, prev, now, _problem(health))


def _judge_member(health: ReplicaHealth, sla: ReplicaSla, prev: ReplicaPolicyState, now: float,
                  problem: str) -> ReplicaPolicyState:
    """A pool member: out after eject_after bad cycles in a row, or at once when its p95
    since it was admitted breaks the SLA's p95."""
    if not problem:
        # Sorting the window costs a fleet's every cluster every cycle: only with a p95 SLA.
        p95 = p95_since(health.samples, prev.admitted_at) if sla.p95 is not None else None
        if sla.p95 is not None and p95 is not None and p95 > sla.p95:
            return replace(prev, eligible=False, bad_streak=0, good_streak=0, reason=f"p95 {_d(p95)} > {_d(sla.p95)}")
        if health.staleness is not None and health.staleness > sla.max_lag:
            problem = f"staleness {_d(health.staleness)} > max_lag {_d(sla.max_lag)}{_why(health)}"
    if not problem:
        return replace(prev, bad_streak=0, good_streak=0, reason="")
    streak = prev.bad_streak + 1
    if streak >= sla.eject_after:
        return replace(prev, eligible=False, bad_streak=0, good_streak=0, reason=f"{problem} for {streak} cycle(s)")
    return replace(prev, bad_streak=streak, reason=f"{problem} ({streak}/{sla.eject_after})")


def _judge_outsider(health: ReplicaHealth, sla: ReplicaSla, prev: ReplicaPolicyState, now: float,
                    problem: str) -> ReplicaPolicyState:
    """Out of the pool: only a clean run of good cycles brings it back."""
    staleness = health.staleness
    if not problem and staleness is not None and staleness >= sla.readmit_below:
        problem = f"staleness {_d(staleness)} >= readmit_below {_d(sla.readmit_below)}{_why(health)}"
    if not problem and staleness is not None and sla.p95 is not None and staleness > sla.p95:
        problem = f"staleness {_d(staleness)} > p95 SLA {_d(sla.p95)}{_why(health)}"
    if problem:
        return replace(prev, good_streak=0, reason=problem)
    streak = prev.good_streak + 1
    if streak >= sla.readmit_after:
        return ReplicaPolicyState(eligible=True, admitted_at=now,
                                  reason=f"below {_d(sla.readmit_below)} for {streak} cycle(s)")
    return replace(prev, good_streak=streak, reason=f"recovering ({streak}/{sla.readmit_after})")


def decide(replicas: Sequence[ReplicaHealth], slas: Mapping[str, ReplicaSla], rules: PoolRules,
           state: PolicyState, holds: Mapping[str, Hold], now: float, never: Collection[str] = ()) -> Decision:
    """The pool for this cycle. ``never``: replicas measured but never routed to (a Patroni
    member tagged ``noloadbalance``), whatever their health or an operator's hold."""
    judged: dict[str, ReplicaPolicyState] = {}
    for health in replicas:
        prev = state.replicas.get(health.name) or ReplicaPolicyState(eligible=True, admitted_at=now)
        judged[health.name] = _judge(health, slas[health.name], prev, now)

    reasons = {name: s.reason or "healthy" for name, s in judged.items()}
    pool = {name for name, s in judged.items() if s.eligible}
    for name, hold in holds.items():
        if name in judged:
            (pool.add if hold == "in" else pool.discard)(name)
            reasons[name] = f"held {hold} by operator"
    for name in never:
        if name in judged:
            pool.discard(name)
            reasons[name] = "never in the read pool (noloadbalance)"
    _honour_min_replicas(pool, reasons, replicas, slas, rules, state, holds, never)
    if rules.primary_in_read_pool:
        pool.add(PRIMARY)
        reasons[PRIMARY] = "primary_in_read_pool: reads go to the primary too"
    new_pool = frozenset(pool)
    return Decision(new_pool, _changes(state.pool, new_pool, reasons), PolicyState(judged, new_pool), reasons)


def _honour_min_replicas(pool: set[str], reasons: dict[str, str], replicas: Sequence[ReplicaHealth],
                         slas: Mapping[str, ReplicaSla], rules: PoolRules, state: PolicyState,
                         holds: Mapping[str, Hold], never: Collection[str]) -> None:
    """Never fewer than min_replicas: the primary joins (fallback_to_primary), or the
    least-behind of the rest stay (never one an operator holds out)."""
    healthy = len(pool)
    if healthy >= rules.min_replicas:
        return
    if rules.fallback_to_primary:
        pool.add(PRIMARY)
        reasons[PRIMARY] = f"fallback: {healthy} healthy replica(s) < min_replicas {rules.min_replicas}"
        return
    by_health = {h.name: h for h in replicas}

    def keep_order(name: str) -> tuple[bool, float, str]:
        health = by_health[name]
        usable = (health.reachable and health.streaming and health.staleness is not None
                  and health.follows_primary is not False)
        lag = _lag_key(health.staleness)
        if name in state.pool:
            # Stays kept unless another is clearly less behind: by more than its
            # max_lag and by more than half its staleness.
            lag = min(lag - slas[name].max_lag, lag / 2)
        return (not usable, lag, name)

    candidates = sorted((n for n in by_health if n not in pool and holds.get(n) != "out" and n not in never
                         and not by_health[n].promoted), key=keep_order)
    for name in candidates[: rules.min_replicas - healthy]:
        pool.add(name)
        reasons[name] = f"kept to honour min_replicas {rules.min_replicas} ({reasons[name]})"


def _changes(before: frozenset[str], after: frozenset[str], reasons: Mapping[str, str]) -> tuple[PoolChange, ...]:
    return tuple(
        [PoolChange(m, "remove", "enough healthy replicas again") if m == PRIMARY
         else PoolChange(m, "eject", reasons.get(m, "no longer configured"))
         for m in sorted(before - after)]
        + [PoolChange(m, "add" if m == PRIMARY else "readmit", reasons.get(m, ""))
           for m in sorted(after - before)])


def _lag_key(staleness: float | None) -> float:
    return math.inf if staleness is None else staleness


def route_to_current_primary(pool: frozenset[str], writer_member: str | None, replicas: Sequence[str],
                             primary_routable: bool = True) -> frozenset[str] | None:
    """The pool as the pooler must route it. ``primary`` in the pool (the fallback) means
    whichever node accepts writes now: after a failover to a configured replica, that
    replica's address, not the configured primary's (down, or a replica itself by now);
    in a discovered cluster, the leader member. A primary with no one address (a
    multi-host writer DSN) is never routed to: with no member known to accept writes
    this cycle, None (leave the pooler as it is until one is)."""
    if PRIMARY not in pool:
        return pool
    if writer_member is not None and writer_member in replicas:
        return (pool - {PRIMARY}) | {writer_member}
    return pool if primary_routable else None
