"""What decide() promises whatever the cycles bring (hypothesis): the pool never falls
below min_replicas, an operator's hold always wins, an ejected replica is not back before
readmit_after good cycles, and the same inputs give the same decision. The tables in
test_policy.py show the rules one case at a time; these state them for every case."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st
from lagwatch.act.policy import PRIMARY, Decision, Hold, PolicyState, PoolRules, ReplicaHealth, decide
from lagwatch.config import ReplicaSla

NAMES = ("r1", "r2", "r3")


@dataclass(frozen=True)
class Scenario:
    names: tuple[str, ...]
    slas: dict[str, ReplicaSla]
    rules: PoolRules
    start: frozenset[str]
    cycles: list[tuple[ReplicaHealth, ...]]
    holds: list[dict[str, Hold]]
    never: frozenset[str]


@st.composite
def slas(draw: st.DrawFn) -> ReplicaSla:
    max_lag = draw(st.sampled_from([0.05, 0.5, 2.0]))
    return ReplicaSla(max_lag=max_lag, p95=None, eject_after=draw(st.integers(1, 3)),
                      readmit_below=max_lag * draw(st.sampled_from([0.25, 0.5, 1.0])),
                      readmit_after=draw(st.integers(1, 4)))


@st.composite
def health(draw: st.DrawFn, name: str) -> ReplicaHealth:
    return ReplicaHealth(
        name,
        staleness=draw(st.one_of(st.none(), st.sampled_from([0.0, 0.01, 0.2, 0.6, 1.5, 3.0, 30.0]))),
        reachable=draw(st.booleans() | st.just(True)),
        streaming=draw(st.booleans() | st.just(True)),
        promoted=draw(st.sampled_from([False] * 9 + [True])),
        follows_primary=draw(st.sampled_from([None, True, True, True, False])))


@st.composite
def scenarios(draw: st.DrawFn, *, with_holds: bool = True, with_min: bool = True) -> Scenario:
    names = NAMES[: draw(st.integers(1, len(NAMES)))]
    rules = PoolRules(min_replicas=draw(st.integers(0, len(names) + 1)) if with_min else 0,
                      fallback_to_primary=draw(st.booleans()), primary_in_read_pool=draw(st.booleans()))
    count = draw(st.integers(1, 20))
    cycles = [tuple(draw(health(n)) for n in names) for _ in range(count)]
    hold_choice = st.dictionaries(st.sampled_from(names), st.sampled_from(["in", "out"]), max_size=2)
    holds = [draw(hold_choice) if with_holds else {} for _ in range(count)]
    return Scenario(names, {n: draw(slas()) for n in names}, rules,
                    draw(st.frozensets(st.sampled_from(names))), cycles, holds,
                    draw(st.frozensets(st.sampled_from(names), max_size=1)) if with_holds else frozenset())


def run(s: Scenario) -> list[Decision]:
    state = PolicyState.from_pool(s.start, s.names, now=0.0)
    out = []
    for i, (cycle, holds) in enumerate(zip(s.cycles, s.holds, strict=True), start=1):
        decision = decide(cycle, s.slas, s.rules, state, holds, now=float(i), never=s.never)
        state = decision.state
        out.append(decision)
    return out


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_never_below_min_replicas(s: Scenario) -> None:
    for cycle, holds, decision in zip(s.cycles, s.holds, run(s), strict=True):
        replicas_in = decision.pool - {PRIMARY}
        # What min_replicas may keep: not held out, not noloadbalance, not promoted (no
        # replica now). Fewer of those than min_replicas: all of them.
        keepable = {h.name for h in cycle if holds.get(h.name) != "out" and h.name not in s.never and not h.promoted}
        if s.rules.fallback_to_primary and len(replicas_in) < s.rules.min_replicas:
            assert PRIMARY in decision.pool, decision
        else:
            assert len(replicas_in) >= min(s.rules.min_replicas, len(keepable | replicas_in)), decision
        assert decision.pool <= {*s.names, PRIMARY}
        assert (PRIMARY in decision.pool) >= s.rules.primary_in_read_pool


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_a_hold_always_wins(s: Scenario) -> None:
    for holds, decision in zip(s.holds, run(s), strict=True):
        for name, hold in holds.items():
            if name in s.never:
                assert name not in decision.pool  # noloadbalance: never routed to, held or not
            else:
                assert (name in decision.pool) == (hold == "in"), (name, hold, decision)
                assert decision.reasons[name] == f"held {hold} by operator"


@settings(max_examples=150, deadline=None)
@given(scenarios(with_holds=False, with_min=False))
def test_an_ejected_replica_is_not_back_before_readmit_after_good_cycles(s: Scenario) -> None:
    """Left to the policy alone (no hold, no min_replicas to keep one), a replica ejected at
    cycle i is readmitted no sooner than cycle i + readmit_after, and only after that many
    cycles in a row that were good (reachable, streaming, following, below readmit_below)."""
    ejected_at: dict[str, int] = {}
    for i, decision in enumerate(run(s), start=1):
        for change in decision.changes:
            if change.member == PRIMARY:
                continue
            if change.action == "eject":
                ejected_at[change.member] = i
            elif change.action == "readmit" and change.member in ejected_at:
                sla = s.slas[change.member]
                assert i - ejected_at[change.member] >= sla.readmit_after, (change, ejected_at)
                recent = [next(h for h in c if h.name == change.member) for c in s.cycles[i - sla.readmit_after:i]]
                assert all(h.reachable and h.streaming and h.follows_primary is not False and not h.promoted
                           and h.staleness is not None and h.staleness < sla.readmit_below for h in recent), recent


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_the_same_inputs_give_the_same_decision(s: Scenario) -> None:
    state = PolicyState.from_pool(s.start, s.names, now=0.0)
    for i, (cycle, holds) in enumerate(zip(s.cycles, s.holds, strict=True), start=1):
        first = decide(cycle, s.slas, s.rules, state, holds, now=float(i), never=s.never)
        again = decide(cycle, s.slas, s.rules, state, holds, now=float(i), never=s.never)
        assert first == again
        state = first.state
