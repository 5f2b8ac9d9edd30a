"""replicastate.py: a replica's state from typed parts, whether it streams, whether it
follows the primary (each a table: the situation, what it reads as)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from lagwatch.estimate.history import LagReading
from lagwatch.estimate.replicastate import ReplaySide, follows_primary, replica_state, replica_streaming
from lagwatch.estimate.roles import RoleView
from lagwatch.estimate.snapshot import NodeObservation
from lagwatch.estimate.windows import HistogramCounts, LagSamples
from lagwatch.views.replication import WalSender
from lagwatch.views.server import ServerPosition
from lagwatch.views.wal_receiver import WalReceiver


def sender(state: str | None = "streaming") -> WalSender:
    return WalSender("r1", "127.0.0.2", state, "async", "r1", 100, 100, 100, 100, 90, None, None, None)


def answer(receiver: WalReceiver | None = None, views: dict[str, bool] | None = None) -> NodeObservation:
    return NodeObservation(cluster="c", node="r1", role="replica", observed_at=1.0, duration=0.01,
                           receiver=receiver, views=views or {})


@pytest.mark.parametrize(("situation", "answered", "walsender", "expected"), [
    ("its own receiver streams", answer(WalReceiver("streaming")), None, True),
    ("its own receiver is down, the primary still streams to it", answer(WalReceiver(None)), sender(), False),
    ("unreachable, the primary streams to it", None, sender(), True),
    ("unreachable, the primary's walsender catching up", None, sender("catchup"), False),
    ("unreachable, the primary's walsender state hidden", None, sender(None), None),
    ("its receiver view not readable, no walsender", answer(views={"wal_receiver": False}), None, None),
    ("unreachable, no walsender", None, None, False),
])
def test_streaming(situation: str, answered: NodeObservation | None, walsender: WalSender | None,
                   expected: bool | None) -> None:
    assert replica_streaming(answered, walsender) is expected, situation


def roles(primary: NodeObservation | None, timeline: int | None = 2) -> RoleView:
    return RoleView(primary=primary, primaries=1 if primary else 0, timeline=timeline, fork=None, changed=False,
                    role_changes_total=0)


PRIMARY = NodeObservation(cluster="c", node="primary", role="primary", observed_at=1.0, duration=0.01)
HIDDEN = dataclasses.replace(PRIMARY, views={"replication": False})


def on_timeline(timeline: int) -> NodeObservation:
    return dataclasses.replace(answer(WalReceiver("streaming", timeline=timeline)),
                               position=ServerPosition(True, None, 90, 90, "not paused", None))


@pytest.mark.parametrize(("situation", "walsender", "replica", "view", "expected"), [
    ("no primary this cycle", sender(), None, roles(None), None),
    ("the primary streams to it", sender(), None, roles(PRIMARY), True),
    ("cascaded: its receiver on the primary's timeline", None, on_timeline(2), roles(PRIMARY), True),
    ("left on the old timeline", None, on_timeline(1), roles(PRIMARY), False),
    ("no walsender, the primary's replication view read", None, None, roles(PRIMARY), False),
    ("no walsender, the primary's replication view hidden", None, None, roles(HIDDEN), None),
])
def test_follows_primary(situation: str, walsender: WalSender | None, replica: NodeObservation | None,
                         view: RoleView, expected: bool | None) -> None:
    assert follows_primary(walsender, replica, view) is expected, situation


def test_every_field_comes_from_the_part_that_knows_it() -> None:
    """Each part's values land in the fields named for them (a swapped pair of arguments of
    one type, say two LSNs, would pass mypy: this would catch it)."""
    reading = LagReading(staleness=1.5, staleness_source="replica", staleness_evidence="wal_commit",
                         staleness_bound="short_of", staleness_at=10.0, replay_lsn=4242, window=None,
                         histogram=HistogramCounts((), (), 0.0, 0), samples=LagSamples())
    side = ReplaySide(recovery=None, replay_load=None, conflicts_total={"lock": 3})
    state = replica_state("r1", reading, None, None, configured=True, node_up=True, walsender=sender(),
                          streaming=True, receiver=WalReceiver("streaming"), follows_primary=True, side=side)
    got: dict[str, Any] = dataclasses.asdict(state)
    for name, value in dataclasses.asdict(reading).items():
        assert got[name] == value, name
    assert (got["configured"], got["node_up"], got["streaming"], got["follows_primary"]) == (True, True, True, True)
    assert got["wal_receiver_status"] == "streaming" and got["conflicts_total"] == {"lock": 3}
    assert got["receive_lsn"] is None  # no answer of its own: nothing it would have said
    bare = replica_state("r2", reading, None, None, configured=False, node_up=None, walsender=sender(), streaming=None)
    assert bare.conflicts_total == {} and bare.recovery is None and bare.follows_primary is None
