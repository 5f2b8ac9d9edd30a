"""A node's health across cycles (estimate/nodehealth.py): counters since start, and one log
line when it goes down (with why) and one when it is back, never one per cycle."""

from __future__ import annotations

import logging

import pytest
from lagwatch.estimate.nodehealth import NodeHealthTracker
from lagwatch.estimate.roles import RoleTracker
from lagwatch.estimate.snapshot import ErrorKind, NodeObservation
from lagwatch.views.server import ServerPosition


def obs(at: float, error: ErrorKind | None = None, connects: int = 1) -> NodeObservation:
    return NodeObservation(cluster="main", node="replica1", role="replica", observed_at=at, duration=0.01,
                           position=None if error else ServerPosition(True, None, 100, 100, "not paused", 1.0),
                           error_kind=error, error="no answer" if error else None, connects_total=connects)


def test_counters_and_one_line_per_change(caplog: pytest.LogCaptureFixture) -> None:
    tracker, roles = NodeHealthTracker("main"), RoleTracker("main")
    caplog.set_level(logging.INFO, logger="lagwatch.nodes")
    # (at, error, connects as the poller counted them) -> (up, polls, errors, connects, the line said)
    table = [
        (0.0, None, 1, True, 1, {}, 1, None),
        (1.0, None, 1, True, 2, {}, 1, None),  # up and up: nothing said
        (2.0, "timeout", 1, False, 3, {"timeout": 1}, 1, "main/replica1: down: no answer (timeout)"),
        (3.0, "connect", 2, False, 4, {"timeout": 1, "connect": 1}, 2, None),  # still down: said once
        (5.5, None, 3, True, 5, {"timeout": 1, "connect": 1}, 3, "main/replica1: up again after 3.5s down"),
    ]
    for at, error, connects, up, polls, errors, connects_total, said in table:
        caplog.clear()
        o = obs(at, error, connects)
        health = tracker.health(o, roles.observe([o]))
        assert (health.up, health.polls_total, health.errors_total, health.connects_total) == (
            up, polls, errors, connects_total), at
        lines = [r.getMessage() for r in caplog.records if r.name == "lagwatch.nodes"]
        assert lines == ([said] if said else []), at
    tracker.forget("replica1")  # gone from the cluster: counted afresh if it comes back
    o = obs(6.0)
    assert tracker.health(o, roles.observe([o])).polls_total == 1
