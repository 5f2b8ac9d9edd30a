"""One function decides a replica's condition; the log line, check, /status and
/api/status all say the same for every condition."""

from __future__ import annotations

import pytest
from lagwatch.check import CRITICAL, OK, UNKNOWN, WARNING, evaluate
from lagwatch.config import ReplicaSla
from lagwatch.estimate.snapshot import (
    CONDITION_TEXT,
    ClusterSnapshot,
    NodeHealth,
    ReplicaState,
    Snapshot,
    replica_condition,
)
from lagwatch.estimate.windows import LagHistogram
from lagwatch.serve.cyclelog import cycle_line
from lagwatch.serve.status import snapshot_status
from lagwatch.serve.status_page import render

SLA = ReplicaSla(max_lag=2.0, p95=None, eject_after=2, readmit_below=1.0, readmit_after=3)


def replica(**kw: object) -> ReplicaState:
    fields: dict[str, object] = {"name": "replica1", "configured": True, "staleness": 0.01,
                                 "staleness_source": "replica", "window": None,
                                 "histogram": LagHistogram().snapshot(), "replay_lsn": 1, "streaming": True,
                                 "node_up": True, "replay_pause_state": "not paused"}
    fields.update(kw)
    return ReplicaState(**fields)  # type: ignore[arg-type]


CASES = [
    ("down", {"node_up": False, "streaming": False}, CRITICAL),
    ("not_streaming", {"streaming": False}, CRITICAL),
    ("cannot_see", {"streaming": None}, UNKNOWN),
    ("paused", {"replay_pause_state": "paused", "staleness": 9.0}, WARNING),
    ("unknown", {"staleness": None}, UNKNOWN),
    ("behind", {"staleness": 3.0}, OK),  # check's thresholds are its own (5s / 30s)
    ("streaming", {}, OK),
]


@pytest.mark.parametrize(("condition", "fields", "check_state"), CASES)
def test_every_view_says_the_same(condition: str, fields: dict[str, object], check_state: int) -> None:
    r = replica(**fields)
    assert replica_condition(r, SLA) == condition
    nodes = (NodeHealth("primary", "primary", True, 180000, 0.01, 1, {}, None, {}),)
    cluster = ClusterSnapshot("main", 100, None, (r,), None, nodes, slas={"replica1": SLA})
    snapshot = Snapshot(0.0, 0.01, 1, 0, (cluster,))
    text = CONDITION_TEXT[condition]  # type: ignore[index]
    line = cycle_line(cluster)
    assert (text.upper().replace(" ", "-") in line) == (condition != "streaming"), line
    state, rows, _ = evaluate(snapshot, warning=5.0, critical=30.0)
    assert rows[0].state == check_state and state == check_state
    assert rows[0].note == {"down": "unreachable", "not_streaming": "not streaming (no WAL receiver)"}.get(
        condition, text)
    assert snapshot_status(snapshot)["clusters"][0]["replicas"][0]["condition"] == condition
    page = render(snapshot)
    assert 'data-label="state" class="' in page and f">{text}</td>" in page
