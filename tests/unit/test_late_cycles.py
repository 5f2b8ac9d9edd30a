"""What a cycle does with answers that are no evidence (daemon.py): a cluster lagwatch was
late for keeps its last state and decides nothing; nodes still making their first connection
read neither up nor down. The polls are scripted (no server); the policy, tracker and
pooler adapter are the real ones."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from lagwatch import daemon as daemon_module
from lagwatch.act.leader import Standing
from lagwatch.config import parse_config
from lagwatch.daemon import Daemon
from lagwatch.estimate.snapshot import LockHolder, NodeObservation, Snapshot
from lagwatch.views.replication import WalSender
from lagwatch.views.server import ServerPosition
from lagwatch.views.wal_receiver import WalReceiver

SLA = {"max_lag": "2s", "eject_after": 1, "readmit_after": 2, "min_replicas": 0}


class StubLeadership:
    """This instance leads every cluster, known at once."""

    me = LockHolder(7, "lagwatch-leader", "lagwatch", "", True)

    async def want(self, claims: Any) -> None:
        pass

    def start(self) -> list[asyncio.Future[None]]:
        return []

    def settle(self, now: float) -> None:
        pass

    def standing(self, cluster: str) -> Standing:
        return Standing(True, self.me)

    def retime(self, *args: Any) -> None:
        pass

    async def close(self) -> None:
        pass


def observe(cluster: str, node: str, t: float, **how: Any) -> NodeObservation:
    """``node`` of ``cluster`` answering healthy at ``t`` (the primary at 1000 bytes a
    second, replicas caught up), or as ``how`` says (pending=..., error_kind=...)."""
    lsn = int(1000 * (t + 1))
    if how:
        return NodeObservation(cluster=cluster, node=node, role="primary" if node == "primary" else "replica",
                               observed_at=t, duration=0.001, **how)
    if node == "primary":
        senders = tuple(WalSender(application_name=r, client_addr=None, state="streaming", sync_state="async",
                                  slot_name=r, current_lsn=lsn, sent_lsn=lsn, write_lsn=lsn, flush_lsn=lsn,
                                  replay_lsn=lsn, write_lag=None, flush_lag=None, replay_lag=None)
                        for r in ("replica1", "replica2"))
        return NodeObservation(cluster=cluster, node=node, role="primary", observed_at=t, duration=0.001,
                               position=ServerPosition(False, lsn, None, None, None, None), walsenders=senders)
    return NodeObservation(cluster=cluster, node=node, role="replica", observed_at=t, duration=0.001,
                           position=ServerPosition(True, None, lsn, lsn, "not paused", 1.0),
                           receiver=WalReceiver("streaming"))


Script = Callable[[str, str, float], NodeObservation]


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Daemon, list[Script]]:
    """Two clusters, a and b, under pool control (a real command pooler); each cycle's
    answers come from the last script pushed."""
    config = parse_config({"interval": "1s", "state_dir": str(tmp_path / "state"), "clusters": [
        {"name": name, "primary": {"dsn": "host=p"}, "sla": SLA,
         "replicas": [{"name": "replica1", "dsn": "host=r1"}, {"name": "replica2", "dsn": "host=r2"}],
         "pooler": {"kind": "command", "template": "{members}\n", "output_file": str(tmp_path / f"{name}.txt"),
                    "reload_command": ["true"]}} for name in ("a", "b")]})
    daemon = Daemon(config)
    daemon.leadership = StubLeadership()  # type: ignore[assignment]
    scripts: list[Script] = []
    clock = [100.0]

    async def poll_all(pollers: Sequence[Any], budget: float, alongside: Any = ()) -> list[NodeObservation]:
        clock[0] += 1
        return [scripts[-1](p.cluster.name, p.node, clock[0]) for p in pollers]

    monkeypatch.setattr(daemon_module, "poll_all", poll_all)
    monkeypatch.setattr(daemon_module.time, "monotonic", lambda: clock[0])
    return daemon, scripts


def run(daemon: Daemon, cycles: int) -> list[Snapshot]:
    async def go() -> list[Snapshot]:
        return [await daemon.cycle() for _ in range(cycles)]

    return asyncio.run(go())


def test_a_cluster_lagwatch_was_late_for_keeps_its_state_and_decides_nothing(
        fleet: tuple[Daemon, list[Script]], caplog: pytest.LogCaptureFixture) -> None:
    daemon, scripts = fleet
    scripts.append(lambda c, n, t: observe(c, n, t))
    [healthy] = run(daemon, 3)[-1:]
    assert {c.name: c.pool.members for c in healthy.clusters if c.pool} == {
        "a": {"replica1", "replica2"}, "b": {"replica1", "replica2"}}
    caplog.clear()
    caplog.set_level(logging.INFO, logger="lagwatch")
    # a: replica1's answer came in too late (and its primary's too); b: replica1 refuses connections.
    scripts.append(lambda c, n, t: observe(c, n, t, pending="late") if (c, n) in {("a", "replica1"), ("a", "primary")}
                   else observe(c, n, t, error_kind="connect", error="refused") if (c, n) == ("b", "replica1")
                   else observe(c, n, t))
    late = run(daemon, 3)
    a = [next(c for c in s.clusters if c.name == "a") for s in late]
    b = [next(c for c in s.clusters if c.name == "b") for s in late]
    assert [c.carried_cycles for c in a] == [1, 2, 3]
    assert all(n.up for c in a for n in c.nodes)  # as last known: up
    assert all(c.pool is not None and c.pool.members == {"replica1", "replica2"} and not c.pool.changes_total
               for c in a)
    assert late[-1].late_answers_total == 6
    # The real failure acts: b's replica1 is down and out after eject_after (1) cycle.
    assert [c.carried_cycles for c in b] == [0, 0, 0]
    assert not next(n for n in b[-1].nodes if n.name == "replica1").up
    assert b[-1].pool is not None and b[-1].pool.members == {"replica2"}
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if m.startswith("a") and ("down" in m or "pool change" in m)], said
    changes = [m for m in said if "pool change" in m]
    assert len(changes) == 1 and "cluster=b replica=replica1 action=eject reason='unreachable for 1 cycle(s)'" \
        in changes[0], changes
    # Answers on time again: a is tracked afresh, nothing changed for it.
    scripts.append(lambda c, n, t: observe(c, n, t))
    [again] = run(daemon, 1)
    a_again = next(c for c in again.clusters if c.name == "a")
    assert a_again.carried_cycles == 0 and a_again.pool is not None and not a_again.pool.changes_total


def test_nodes_still_connecting_read_neither_up_nor_down(fleet: tuple[Daemon, list[Script]],
                                                         caplog: pytest.LogCaptureFixture) -> None:
    daemon, scripts = fleet
    caplog.set_level(logging.INFO, logger="lagwatch")
    scripts.append(lambda c, n, t: observe(c, n, t, pending="connecting") if (c, n) == ("b", "replica2")
                   else observe(c, n, t))
    [first, second] = run(daemon, 2)
    # b is published once each of its nodes has answered or failed; a already is.
    assert [c.name for c in first.clusters] == ["a"] and first.connecting == (("b", "replica2"),)
    assert [c.name for c in second.clusters] == ["a"] and second.connecting == (("b", "replica2"),)
    scripts.append(lambda c, n, t: observe(c, n, t))
    [third] = run(daemon, 1)
    assert [c.name for c in third.clusters] == ["a", "b"] and third.connecting == ()
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    # (A command pooler never applied yet says so once per cluster: not about nodes.)
    assert not [m for level, m in said if level >= logging.WARNING and "pooler command" not in m], said
    assert [m for _, m in said if m.startswith("first cycle:")] == [
        "first cycle: 5 of 6 node(s) answered; 1 still connecting (read neither up nor down until they answer "
        "or fail)"]
    assert [m for _, m in said if m.startswith("every node has answered")]
