"""Which of the shipped alert rules' conditions hold in one cluster snapshot: what
Prometheus will raise if nothing changes before each rule's ``for:`` has passed.

Shown on /status and in /api/status, so that whoever watches a switchover (the demo, or an
on-call engineer with no Prometheus at hand) sees what is about to page, with the rule's
name to look up its runbook. Prometheus stays the one that pages: this reads the same
metrics' values off the snapshot, rule by rule, and tests/unit/test_alerting.py checks
each name, severity and ``for:`` against alerts/lagwatch.rules.yml. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from lagwatch.durations import format_duration
from lagwatch.estimate.snapshot import ClusterSnapshot, ReplicaState

Severity = Literal["page", "warning", "info"]

# alert -> (severity, its rule's for: in seconds), as in alerts/lagwatch.rules.yml.
RULES: dict[str, tuple[Severity, float]] = {
    "LagwatchSplitBrain": ("page", 15),
    "LagwatchNoPrimary": ("page", 120),
    "LagwatchNodeDown": ("warning", 120),
    "LagwatchRoleChanged": ("info", 0),
    "LagwatchReplicaNotFollowingPrimary": ("warning", 120),
    "LagwatchReplicaNotStreaming": ("warning", 300),
    "LagwatchReplicaReplayPaused": ("warning", 900),
    "LagwatchReplicaEjected": ("warning", 300),
    "LagwatchReplicaReplayAtLimit": ("warning", 900),
    "LagwatchReplicaReplayBlockedByQuery": ("warning", 60),
    "LagwatchSyncCommitsStalled": ("page", 30),
    "LagwatchSyncOneLossFromStall": ("warning", 300),
}
ROLE_CHANGE_RECENT_SECONDS = 600  # LagwatchRoleChanged looks back 10 minutes
NOT_FOLLOWING_AFTER_CHANGE_SECONDS = 3600  # LagwatchReplicaNotFollowingPrimary: a change in the last hour
REPLAY_AT_LIMIT = 0.9  # LagwatchReplicaReplayAtLimit: the busy ratio above which replay has no headroom


@dataclass(frozen=True)
class AlertCondition:
    alert: str
    severity: Severity
    for_seconds: float  # how long the condition must hold before Prometheus fires
    subject: str  # the node or replica it is about ("" for the cluster)
    text: str


def conditions(c: ClusterSnapshot) -> tuple[AlertCondition, ...]:
    """Every rule whose condition holds in ``c``, pages first."""
    order = {"page": 0, "warning": 1, "info": 2}
    return tuple(sorted(_conditions(c), key=lambda a: (order[a.severity], a.alert, a.subject)))


def _make(alert: str, subject: str, text: str) -> AlertCondition:
    severity, for_seconds = RULES[alert]
    return AlertCondition(alert, severity, for_seconds, subject, text)


def _conditions(c: ClusterSnapshot) -> Iterator[AlertCondition]:
    yield from _role_conditions(c)
    yield from _replica_conditions(c)
    yield from _sync_conditions(c)


def _role_conditions(c: ClusterSnapshot) -> Iterator[AlertCondition]:
    if c.primaries >= 2:
        yield _make("LagwatchSplitBrain", "", f"{c.primaries} servers accept writes")
    elif c.primaries == 0 and not any(n.observed_role == "standby_leader" for n in c.nodes):
        yield _make("LagwatchNoPrimary", "", "no node accepts writes")
    for n in c.nodes:
        if not n.up:
            yield _make("LagwatchNodeDown", n.name, f"{n.name} does not answer")
    recent = c.last_role_change_ago
    if recent is not None and recent <= ROLE_CHANGE_RECENT_SECONDS:
        yield _make("LagwatchRoleChanged", "", f"{c.last_role_change} {format_duration(recent)} ago")


def _replica_conditions(c: ClusterSnapshot) -> Iterator[AlertCondition]:
    recent = c.last_role_change_ago
    lately_changed = recent is not None and recent <= NOT_FOLLOWING_AFTER_CHANGE_SECONDS
    pool = c.pool
    members = pool.members if pool is not None else None
    for r in c.replicas:
        if not r.configured:
            continue
        if r.follows_primary is False and lately_changed:
            yield _make("LagwatchReplicaNotFollowingPrimary", r.name,
                        f"{r.name} does not replicate from the current primary ({c.primary_node or '?'})")
        if r.streaming is False:
            yield _make("LagwatchReplicaNotStreaming", r.name, f"{r.name}'s WAL receiver is not streaming")
        if r.replay_paused:
            yield _make("LagwatchReplicaReplayPaused", r.name, f"replay is paused on {r.name}")
        yield from _replay_conditions(r)
    if pool is None or members is None:
        return
    for r in c.replicas:
        if r.configured and r.name not in members and pool.holds.get(r.name) != "out":
            yield _make("LagwatchReplicaEjected", r.name,
                        f"{r.name} is out of the read pool: {pool.reasons.get(r.name, '?')}")


def _replay_conditions(r: ReplicaState) -> Iterator[AlertCondition]:
    """What holds a replica's replay (diagnosis.py) and how busy it is (replayload.py)."""
    if r.diagnosis is not None and r.diagnosis.cause == "recovery_conflict":
        yield _make("LagwatchReplicaReplayBlockedByQuery", r.name, r.diagnosis.detail)
    busy = r.replay_load.busy_ratio if r.replay_load is not None else None
    if busy is not None and busy > REPLAY_AT_LIMIT:
        yield _make("LagwatchReplicaReplayAtLimit", r.name, f"{r.name}'s replay is busy {busy:.0%} of the time")


def _sync_conditions(c: ClusterSnapshot) -> Iterator[AlertCondition]:
    s = c.sync
    if s is None or not s.waits_on_standbys:
        return
    if s.at_risk:
        yield _make("LagwatchSyncCommitsStalled", "",
                    f"{s.healthy} healthy synchronous standby(s), commits wait for {s.required}")
    elif s.spare == 0:
        yield _make("LagwatchSyncOneLossFromStall", "",
                    f"{s.healthy} healthy synchronous standby(s) = required: one more loss stalls commits")
