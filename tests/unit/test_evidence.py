"""What a cycle publishes of a cluster when some answers are no evidence (estimate/evidence.py):
tracked afresh when every node answered or failed; carried over as last published when an
answer came too late or a node is still connecting; nothing before a first publication."""

from __future__ import annotations

import logging

import pytest
from lagwatch.config import parse_config
from lagwatch.estimate.evidence import Evidence
from lagwatch.estimate.snapshot import NodeObservation, Pending
from lagwatch.estimate.tracker import ClusterTracker
from lagwatch.views.server import ServerPosition

CONFIG = parse_config({"interval": "1s", "clusters": [{
    "name": "main", "primary": {"dsn": "host=p"}, "replicas": [{"name": "replica1", "dsn": "host=r1"}]}]})


def answers(at: float, replica: Pending | None = None) -> list[NodeObservation]:
    primary = NodeObservation(cluster="main", node="primary", role="primary", observed_at=at, duration=0.01,
                              position=ServerPosition(False, 1000, None, None, None, None))
    if replica is not None:
        return [primary, NodeObservation(cluster="main", node="replica1", role="replica", observed_at=at,
                                         duration=0.9, pending=replica)]
    return [primary, NodeObservation(cluster="main", node="replica1", role="replica", observed_at=at, duration=0.01,
                                     position=ServerPosition(True, None, 1000, 1000, "not paused", 1.0))]


def test_a_cluster_with_no_evidence_is_carried_over_or_not_published() -> None:
    evidence, tracker = Evidence(), ClusterTracker(CONFIG.clusters[0], 1.0, 60.0)
    connecting: list[tuple[str, str]] = []
    # Still connecting before any publication: nothing published, the node listed.
    assert evidence.track(tracker, answers(0.0, "connecting"), 0.0, connecting) is None
    assert connecting == [("main", "replica1")]
    first = evidence.track(tracker, answers(1.0), 1.0, [])
    assert first is not None and first.carried_cycles == 0
    evidence.published([first])
    # Late: the last publication carried over, counted; never a node read down for it.
    for n in (1, 2):
        carried = evidence.track(tracker, answers(1.0 + n, "late"), 1.0 + n, [])
        assert carried is not None and carried.carried_cycles == n
        assert all(node.up for node in carried.nodes)
        evidence.published([carried])
    assert evidence.late_answers == 2
    fresh = evidence.track(tracker, answers(4.0), 4.0, [])
    assert fresh is not None and fresh.carried_cycles == 0


def test_a_start_says_connecting_nodes_in_two_lines(caplog: pytest.LogCaptureFixture) -> None:
    evidence = Evidence()
    caplog.set_level(logging.INFO, logger="lagwatch.daemon")
    evidence.say_connecting(1, [("main", "replica1")], 2)
    evidence.say_connecting(2, [("main", "replica1")], 2)  # still connecting: nothing more
    evidence.say_connecting(3, [], 2)
    evidence.say_connecting(4, [], 2)
    lines = [r.getMessage() for r in caplog.records if r.name == "lagwatch.daemon"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("first cycle: 1 of 2 node(s) answered; 1 still connecting")
    assert lines[1].startswith("every node has answered or failed once")
    assert lines[1].endswith("after start (cycle 3)")  # where a cluster's first cycle line comes
