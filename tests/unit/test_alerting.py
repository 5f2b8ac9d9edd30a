"""The alert conditions /status shows: the same names, severities and for: as the shipped
rules, and each one read right off a snapshot (pure, no servers)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from lagwatch.durations import parse_duration
from lagwatch.estimate.snapshot import ClusterSnapshot, NodeHealth, PoolStatus, ReplicaState
from lagwatch.estimate.syncrep import assess
from lagwatch.estimate.windows import LagHistogram
from lagwatch.serve.alerting import RULES, conditions
from lagwatch.views.replication import WalSender

RULES_FILE = Path(__file__).resolve().parents[2] / "alerts" / "lagwatch.rules.yml"


def shipped_rules() -> dict[str, dict[str, object]]:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


@pytest.mark.parametrize("alert", sorted(RULES))
def test_each_condition_is_a_shipped_rule_with_its_severity_and_for(alert: str) -> None:
    rule = shipped_rules()[alert]
    severity, for_seconds = RULES[alert]
    assert rule["labels"]["severity"] == severity  # type: ignore[index]
    assert parse_duration(str(rule.get("for", "0s"))) == for_seconds


def node(name: str, up: bool = True, role: str = "replica") -> NodeHealth:
    return NodeHealth(name, "primary" if name == "primary" else "replica", up, 180000, 0.01, 5, {}, None, {},
                      observed_role=role if up else "unknown")  # type: ignore[arg-type]


def replica(name: str, **kw: object) -> ReplicaState:
    fields: dict[str, object] = {"name": name, "configured": True, "staleness": 0.0, "staleness_source": "replica",
                                 "window": None, "histogram": LagHistogram().snapshot(), "replay_lsn": 1,
                                 "streaming": True, "node_up": True, "replay_pause_state": "not paused",
                                 "follows_primary": True}
    fields.update(kw)
    return ReplicaState(**fields)  # type: ignore[arg-type]


def cluster(**kw: object) -> ClusterSnapshot:
    base = ClusterSnapshot("main", 100, None, (replica("replica1"), replica("replica2")), None,
                           (node("primary", role="primary"), node("replica1"), node("replica2")), primaries=1,
                           primary_node="primary")
    return replace(base, **kw)  # type: ignore[arg-type]


def names(c: ClusterSnapshot) -> list[tuple[str, str]]:
    return [(a.alert, a.subject) for a in conditions(c)]


def test_a_healthy_cluster_has_none() -> None:
    assert names(cluster()) == []


def test_a_failover_as_it_happens() -> None:
    """The old primary stopped, replica1 promoted 20 s ago, replica2 not yet re-pointed."""
    c = cluster(nodes=(node("primary", up=False), node("replica1", role="primary"), node("replica2")),
                replicas=(replica("replica2", follows_primary=False, streaming=False),), primaries=1,
                primary_node="replica1", role_changes_total=1,
                last_role_change="replica1: replica -> primary (timeline 2)", last_role_change_ago=20.0)
    found = conditions(c)
    assert [(a.alert, a.subject) for a in found] == [
        ("LagwatchNodeDown", "primary"), ("LagwatchReplicaNotFollowingPrimary", "replica2"),
        ("LagwatchReplicaNotStreaming", "replica2"), ("LagwatchRoleChanged", "")]
    assert found[-1].text == "replica1: replica -> primary (timeline 2) 20s ago"
    assert found[1].text == "replica2 does not replicate from the current primary (replica1)"
    # Ten minutes on, the change is history; the replica that does not follow still shows.
    later = names(replace(c, last_role_change_ago=700.0))
    assert ("LagwatchRoleChanged", "") not in later and ("LagwatchReplicaNotFollowingPrimary", "replica2") in later


def test_split_brain_and_no_primary_page_first() -> None:
    found = conditions(cluster(primaries=2, last_role_change="replica1: replica -> primary",
                               last_role_change_ago=1.0))
    assert (found[0].alert, found[0].severity, found[0].text) == ("LagwatchSplitBrain", "page",
                                                                  "2 servers accept writes")
    assert names(cluster(primaries=0))[0] == ("LagwatchNoPrimary", "")


def test_not_following_without_a_role_change_is_left_to_not_streaming() -> None:
    assert names(cluster(replicas=(replica("replica1", follows_primary=False),))) == []


def test_ejected_unless_held_out_and_paused() -> None:
    pool = PoolStatus(kind="pgbouncer", leader=True, dry_run=False, members=frozenset({"replica2"}),
                      pooler_members=frozenset({"replica2"}), reasons={"replica1": "staleness 9s > max_lag 2s"},
                      holds={}, changes_total={}, apply_errors_total=0, read_errors_total=0, last_error=None,
                      events=())
    c = cluster(pool=pool, replicas=(replica("replica1", replay_pause_state="paused"), replica("replica2")))
    assert names(c) == [("LagwatchReplicaEjected", "replica1"), ("LagwatchReplicaReplayPaused", "replica1")]
    held = replace(pool, holds={"replica1": "out"})
    assert names(replace(c, pool=held)) == [("LagwatchReplicaReplayPaused", "replica1")]


def sender(name: str, state: str = "streaming") -> WalSender:
    return WalSender(application_name=name, client_addr=None, state=state, sync_state="quorum", slot_name=name,
                     current_lsn=10, sent_lsn=10, write_lsn=10, flush_lsn=10, replay_lsn=10, write_lag=None,
                     flush_lag=None, replay_lag=None)


def test_synchronous_commits_stalled_and_one_loss_from_it() -> None:
    one_left = assess("ANY 1 (replica1, replica2)", "on", [sender("replica1")])
    assert names(cluster(sync=one_left)) == [("LagwatchSyncOneLossFromStall", "")]
    none_left = assess("ANY 1 (replica1, replica2)", "on", [])
    assert names(cluster(sync=none_left)) == [("LagwatchSyncCommitsStalled", "")]
    local = assess("ANY 1 (replica1, replica2)", "local", [])
    assert names(cluster(sync=local)) == []
