"""The pool policy by tables: sequences of cycles in, pools and changes out."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from lagwatch.act.policy import (
    MIN_P95_SAMPLES,
    PRIMARY,
    Decision,
    Hold,
    PolicyState,
    PoolRules,
    ReplicaHealth,
    decide,
)
from lagwatch.config import ReplicaSla

SLA = ReplicaSla(max_lag=2.0, p95=None, eject_after=2, readmit_below=1.0, readmit_after=3)
NAMES = ("r1", "r2")


def h(name: str, lag: float | None, reachable: bool = True, streaming: bool = True) -> ReplicaHealth:
    return ReplicaHealth(name, lag, reachable, streaming)


def run(cycles: Sequence[Sequence[ReplicaHealth]], *, min_replicas: int = 0, fallback: bool = False,
        holds: dict[str, Hold] | None = None, sla: ReplicaSla = SLA, primary_in_pool: bool = False,
        start: frozenset[str] = frozenset(NAMES)) -> list[Decision]:
    state = PolicyState.from_pool(start, NAMES, now=0.0)
    out = []
    for i, cycle in enumerate(cycles, start=1):
        decision = decide(cycle, {n: sla for n in NAMES}, PoolRules(min_replicas, fallback, primary_in_pool), state,
                          holds or {}, now=float(i))
        state = decision.state
        out.append(decision)
    return out


def pools(decisions: list[Decision]) -> list[set[str]]:
    return [set(d.pool) for d in decisions]


def test_eject_after_n_bad_cycles_then_readmit_after_m_good() -> None:
    lags = [0, 3, 3, 3, 0.5, 0.5, 0.5, 0.5]
    decisions = run([[h("r1", v), h("r2", 0)] for v in lags])
    assert pools(decisions) == [{"r1", "r2"}, {"r1", "r2"}, {"r2"}, {"r2"}, {"r2"}, {"r2"},
                                {"r1", "r2"}, {"r1", "r2"}]
    assert [c.action for d in decisions for c in d.changes] == ["eject", "readmit"]
    assert "staleness 3s > max_lag 2s for 2 cycle(s)" in decisions[2].changes[0].reason


def test_single_spike_does_not_eject() -> None:
    decisions = run([[h("r1", v), h("r2", 0)] for v in [0, 5, 0, 5, 0, 5]])
    assert all(d.pool == {"r1", "r2"} for d in decisions)


def test_readmit_needs_consecutive_good_cycles_below_readmit_threshold() -> None:
    # Between readmit_below (1) and max_lag (2) is neither bad nor good enough: no flapping.
    lags = [3, 3, 0.5, 0.5, 1.5, 0.5, 0.5, 0.5]
    decisions = run([[h("r1", v), h("r2", 0)] for v in lags])
    assert [("r1" in d.pool) for d in decisions] == [True, False, False, False, False, False, False, True]


@pytest.mark.parametrize("bad", [h("r1", None), h("r1", 0, reachable=False), h("r1", 0, streaming=False)])
def test_unknown_unreachable_not_streaming_are_bad_and_never_good(bad: ReplicaHealth) -> None:
    decisions = run([[bad, h("r2", 0)]] * 6)
    assert pools(decisions)[1:] == [{"r2"}] * 5


def test_oscillating_around_max_lag_changes_rarely() -> None:
    lags = [1.9, 2.1, 2.2, 1.9, 2.1, 1.8, 2.3, 2.4, 1.9, 2.1] * 3
    decisions = run([[h("r1", v), h("r2", 0)] for v in lags])
    # Ejected once, at the second cycle in a row above max_lag (2.1 then 2.2), and never
    # readmitted while it hovers above readmit_below: one change in thirty cycles.
    changes = [(i, c.action, c.member) for i, d in enumerate(decisions, start=1) for c in d.changes]
    assert changes == [(3, "eject", "r1")]
    assert pools(decisions) == [{"r1", "r2"}] * 2 + [{"r2"}] * 28


def test_min_replicas_keeps_least_behind() -> None:
    decisions = run([[h("r1", 10), h("r2", 5)]] * 3, min_replicas=1)
    assert decisions[-1].pool == {"r2"}
    assert "kept to honour min_replicas" in decisions[-1].reasons["r2"]
    decisions = run([[h("r1", 10), h("r2", None)]] * 3, min_replicas=1)
    assert decisions[-1].pool == {"r1"}  # unknown counts as furthest behind


def test_fallback_to_primary_joins_and_leaves() -> None:
    cycles = [[h("r1", 10), h("r2", 10)]] * 3 + [[h("r1", 0), h("r2", 0)]] * 4
    decisions = run(cycles, min_replicas=1, fallback=True)
    assert pools(decisions) == [{"r1", "r2"}, {PRIMARY}, {PRIMARY}, {PRIMARY}, {PRIMARY},
                                {"r1", "r2"}, {"r1", "r2"}]
    actions = [(c.member, c.action) for d in decisions for c in d.changes]
    assert actions == [("r1", "eject"), ("r2", "eject"), (PRIMARY, "add"),
                       (PRIMARY, "remove"), ("r1", "readmit"), ("r2", "readmit")]


def test_operator_hold_beats_automation() -> None:
    decisions = run([[h("r1", 10), h("r2", 0)]] * 3, holds={"r1": "in", "r2": "out"})
    assert decisions[-1].pool == {"r1"}
    assert decisions[-1].reasons["r2"] == "held out by operator"


def test_p95_since_admission_ejects_at_once_but_old_spikes_do_not_re_eject() -> None:
    sla = ReplicaSla(max_lag=10.0, p95=0.5, eject_after=5, readmit_below=0.4, readmit_after=2)
    spiky = tuple((float(t), 0.9 if t % 4 == 0 else 0.1) for t in range(MIN_P95_SAMPLES + 5))
    state = PolicyState.from_pool(frozenset(NAMES), NAMES, now=-1.0)
    rules = PoolRules(0, False)
    d = decide([ReplicaHealth("r1", 0.1, True, True, spiky), h("r2", 0)], {n: sla for n in NAMES}, rules,
               state, {}, now=30.0)
    assert d.pool == {"r2"} and d.reasons["r1"].startswith("p95 900ms > 500ms")
    # Good cycles readmit it; the spikes before readmission no longer count.
    for now in (31.0, 32.0):
        d = decide([ReplicaHealth("r1", 0.1, True, True, spiky), h("r2", 0)], {n: sla for n in NAMES}, rules,
                   d.state, {}, now=now)
    assert d.pool == {"r1", "r2"}
    d = decide([ReplicaHealth("r1", 0.1, True, True, spiky), h("r2", 0)], {n: sla for n in NAMES}, rules,
               d.state, {}, now=33.0)
    assert d.pool == {"r1", "r2"}


def test_start_from_pooler_state() -> None:
    state = PolicyState.from_pool(frozenset({"r2"}), NAMES, now=0.0)
    d = decide([h("r1", 0), h("r2", 0)], {n: SLA for n in NAMES}, PoolRules(0, False), state, {}, now=1.0)
    assert d.pool == {"r2"} and d.changes == ()
    # r1, out of the pool at start, earns its way back like any ejected replica.
    for now in (2.0, 3.0):
        d = decide([h("r1", 0), h("r2", 0)], {n: SLA for n in NAMES}, PoolRules(0, False), d.state, {}, now=now)
    assert d.pool == {"r1", "r2"} and [(c.member, c.action) for c in d.changes] == [("r1", "readmit")]


@pytest.mark.parametrize(("later", "kept_after"), [
    # The kept replica stops answering: the reachable one, though behind, takes its place.
    ([h("r1", 3.0), h("r2", None, reachable=False)], {"r1"}),
    # The kept replica stops streaming.
    ([h("r1", 3.0), h("r2", 3.0, streaming=False)], {"r1"}),
    # The kept replica falls far behind while the other recovers most of the way.
    ([h("r1", 1.5), h("r2", 1000.0)], {"r1"}),
    # Slightly behind the other: no swap (hysteresis).
    ([h("r1", 8.0), h("r2", 11.0)], {"r2"}),
])
def test_min_replicas_kept_replica_gives_way_only_when_clearly_worse(later: list[ReplicaHealth],
                                                                      kept_after: set[str]) -> None:
    # Both lag, r2 less: r2 is the one kept. Then the situation changes.
    cycles = [[h("r1", 10.0), h("r2", 5.0)]] * 3 + [later] * 3
    decisions = run(cycles, min_replicas=1)
    assert set(decisions[2].pool) == {"r2"}
    assert set(decisions[-1].pool) == kept_after


def test_p95_ejected_replica_is_not_readmitted_while_steadily_above_p95() -> None:
    """max_lag 2s, p95 500ms, readmit_below 1s: a replica steady at 0.7s breaks the p95
    SLA. It is ejected once, and must not come back (only to be ejected again when its
    p95 fills) while it stays there: one change in 200 cycles, not one every 25."""
    sla = ReplicaSla(max_lag=2.0, p95=0.5, eject_after=2, readmit_below=1.0, readmit_after=5)
    state = PolicyState.from_pool(frozenset(NAMES), NAMES, now=0.0)
    changes = []
    samples: list[tuple[float, float]] = []
    # 200 cycles steady at 0.7s, then back under the p95 SLA for 6 cycles.
    for i, lag in enumerate([0.7] * 200 + [0.1] * 6, start=1):
        samples.append((float(i), lag))
        cycle = [ReplicaHealth("r1", lag, True, True, tuple(samples)), h("r2", 0.0)]
        decision = decide(cycle, {n: sla for n in NAMES}, PoolRules(0, False), state, {}, now=float(i))
        state = decision.state
        changes += [(i, c) for c in decision.changes]
    assert [(c.member, c.action) for _, c in changes] == [("r1", "eject"), ("r1", "readmit")]
    (ejected_at, eject), (readmitted_at, _) = changes
    assert "p95" in eject.reason and ejected_at <= 200 < readmitted_at


def test_min_replicas_does_not_swap_between_two_lagging_replicas() -> None:
    # Both lag; which is less behind alternates every cycle. The kept one stays kept.
    cycles = [[h("r1", 10 + (i % 2) * 5), h("r2", 15 - (i % 2) * 5)] for i in range(10)]
    decisions = run(cycles, min_replicas=1)
    kept = [set(d.pool) for d in decisions[2:]]
    assert len(kept[0]) == 1 and all(k == kept[0] for k in kept), kept


def test_promoted_leaves_at_once_and_demoted_earns_its_way_back() -> None:
    """A switchover seen by the policy: r1 promoted (out at once, no eject_after), then
    demoted and following the new primary with no lag: back only after readmit_after
    good cycles, one change each way."""
    cycles = ([[h("r1", 0), h("r2", 0)]]
              + [[ReplicaHealth("r1", None, True, False, promoted=True), h("r2", 0)]] * 2
              + [[h("r1", 0), h("r2", 0)]] * 4)
    decisions = run(cycles)
    assert pools(decisions) == [{"r1", "r2"}, {"r2"}, {"r2"}, {"r2"}, {"r2"}, {"r1", "r2"}, {"r1", "r2"}]
    assert [(c.member, c.action) for d in decisions for c in d.changes] == [("r1", "eject"), ("r1", "readmit")]
    assert decisions[1].changes[0].reason == "promoted: it accepts writes now"
    assert decisions[3].reasons["r1"] == "recovering (1/3)"


def not_following(name: str) -> ReplicaHealth:
    return ReplicaHealth(name, 0.0, True, True, follows_primary=False)


def test_demoted_old_primary_waits_until_it_follows_the_current_primary() -> None:
    """A replica that streams but not from the current primary (left on the old timeline,
    or a demoted primary not yet re-pointed) reads 0 lag against its own upstream: it is
    ejected like any bad cycle and readmitted only after readmit_after cycles following."""
    cycles = ([[h("r1", 0), h("r2", 0)]] + [[not_following("r1"), h("r2", 0)]] * 4
              + [[h("r1", 0), h("r2", 0)]] * 3)
    decisions = run(cycles)
    assert [("r1" in d.pool) for d in decisions] == [True, True, False, False, False, False, False, True]
    assert decisions[2].changes[0].reason == "not replicating from the current primary for 2 cycle(s)"
    assert decisions[4].reasons["r1"] == "not replicating from the current primary"


def test_min_replicas_prefers_a_replica_that_follows_the_primary() -> None:
    cycles = [[not_following("r1"), h("r2", 30)]] * 4
    decisions = run(cycles, min_replicas=1)
    assert pools(decisions)[2:] == [{"r2"}, {"r2"}]


def test_primary_in_read_pool_is_always_there_beside_the_replicas() -> None:
    """primary_in_read_pool: the primary is a member from the first cycle and never
    leaves, whatever the replicas do; the replicas keep their own hysteresis; a promoted
    replica leaves as a replica (the primary member routes to it from then on)."""
    cycles = ([[h("r1", 0), h("r2", 0)]] + [[h("r1", 5), h("r2", 5)]] * 3
              + [[ReplicaHealth("r1", None, True, False, promoted=True), h("r2", 0)]] * 4)
    decisions = run(cycles, primary_in_pool=True)
    assert pools(decisions) == [{PRIMARY, "r1", "r2"}, {PRIMARY, "r1", "r2"}, {PRIMARY}, {PRIMARY},
                                {PRIMARY}, {PRIMARY}, {PRIMARY, "r2"}, {PRIMARY, "r2"}]
    assert [(c.member, c.action) for c in decisions[0].changes] == [(PRIMARY, "add")]
    assert decisions[0].reasons[PRIMARY] == "primary_in_read_pool: reads go to the primary too"
    assert not any(c.member == PRIMARY and c.action == "remove" for d in decisions for c in d.changes)
