"""Whose lateness is it (lateness.py, session.py): the late-monitor rule as a table, the
loop-lag meter, the pace, and the rule where a cycle applies it (poll_all), with a node
whose connection is a socket pair: the test writes to the other end to make it answer.
No server: what a real one does is in tests/integration/test_overload.py."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import psycopg.errors
import pytest
from lagwatch.config import parse_config
from lagwatch.estimate.lateness import MAX_STRETCH, LoopLag, Pacer, judge_unanswered
from lagwatch.estimate.snapshot import NodeObservation
from lagwatch.read.poll import NodePoller, poll_all
from lagwatch.read.session import SessionContext
from lagwatch.read.viewreader import ViewsRead
from lagwatch.views.probe import Capabilities
from lagwatch.views.server import ServerPosition


@pytest.mark.parametrize("first_connection,answer_waiting,attentive,verdict", [
    # The node was silent while lagwatch listened for over half the budget: evidence.
    (False, False, 0.5, "silent"),
    (False, False, 0.8, "silent"),
    # Lagwatch was late: the node answered and lagwatch did not get to it...
    (False, True, 0.8, "late"),
    (False, True, 0.0, "late"),
    # ...or lagwatch gave it too little attention to say it was silent.
    (False, False, 0.39, "late"),
    # Both late and silent: no evidence either way.
    (False, False, 0.0, "late"),
    # A first connection under way is no evidence yet, however long.
    (True, False, 5.0, "connecting"),
    (True, True, 0.0, "connecting"),
])
def test_the_late_monitor_rule(first_connection: bool, answer_waiting: bool, attentive: float, verdict: str) -> None:
    assert judge_unanswered(first_connection=first_connection, answer_waiting=answer_waiting,
                            attentive=attentive, budget=0.8) == verdict


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Loop:
    """Just what LoopLag asks of the event loop: one timer at a time, fired by the test."""

    def __init__(self) -> None:
        self.due: float | None = None
        self.callback: Any = None

    def call_at(self, when: float, callback: Any) -> Any:
        self.due, self.callback = when, callback
        return self

    def cancel(self) -> None:
        self.due = self.callback = None


def _meter() -> tuple[LoopLag, _Clock, _Loop]:
    clock, loop = _Clock(), _Loop()
    lag = LoopLag(tick=0.05, grace=0.01, clock=clock)
    lag.start(loop)  # type: ignore[arg-type]
    return lag, clock, loop


def _run_ticks_until(lag: LoopLag, clock: _Clock, loop: _Loop, until: float, late_by: float = 0.0) -> None:
    """The loop runs each tick ``late_by`` seconds after it is due, up to ``until``."""
    while loop.due is not None and loop.due + late_by <= until:
        clock.now = loop.due + late_by
        loop.callback()
    clock.now = until


def test_loop_lag_counts_a_stall_as_no_attention() -> None:
    lag, clock, loop = _meter()
    _run_ticks_until(lag, clock, loop, 100.2)  # on time
    mark = lag.mark(clock())
    _run_ticks_until(lag, clock, loop, 100.4)  # attentive
    stall_from = loop.due
    clock.now = 100.8  # the loop stalls: lagwatch busy, or not scheduled
    loop.callback()  # the overdue tick runs at last, 0.4 s late less what was not yet due
    _run_ticks_until(lag, clock, loop, 101.0)
    assert stall_from is not None
    stall = 100.8 - stall_from
    assert lag.stalled(clock()) - mark[1] == pytest.approx(stall)
    assert lag.attentive(mark, clock()) == pytest.approx(0.8 - stall)  # 0.8 s of clock, the stall not attention
    assert lag.take_worst(clock()) == pytest.approx(stall)
    assert lag.take_worst(clock()) == 0.0  # the worst is since last asked


def test_lateness_within_grace_is_not_a_stall() -> None:
    lag, clock, loop = _meter()
    mark = lag.mark(clock())
    _run_ticks_until(lag, clock, loop, 101.0, late_by=0.009)  # every tick late, each within the 10 ms grace
    assert lag.attentive(mark, clock()) == pytest.approx(1.0)
    assert lag.take_worst(clock()) == 0.0


def test_a_stall_under_way_counts_before_the_loop_gets_to_its_tick() -> None:
    """Asked in the very callback that ends a stall, the meter already counts it."""
    lag, clock, loop = _meter()
    mark = lag.mark(clock())
    clock.now += 0.3  # no tick has run: the loop is stalled right now
    assert loop.due is not None
    assert lag.attentive(mark, clock()) == pytest.approx(loop.due - 100.0)  # only until the tick was due
    assert lag.take_worst(clock()) == pytest.approx(clock() - loop.due)


@pytest.mark.parametrize("durations,paces", [
    # Cycles that fit: the configured interval.
    ([0.2, 0.3, 0.2], [1.0, 1.0, 1.0]),
    # A node that never answers holds every cycle to the budget (0.8 s): it fits, nothing stretches.
    ([0.85, 0.85, 0.85], [1.0, 1.0, 1.0]),
    # A cycle that did not fit stretches at once (headroom, whole tenths), relaxes once the
    # last three fit a shorter one.
    ([1.3, 0.4, 0.4, 0.4], [1.7, 1.7, 1.7, 1.0]),
    ([2.5, 2.4, 0.3, 0.3, 0.3], [3.2, 3.2, 3.2, 3.0, 1.0]),
    # Never beyond MAX_STRETCH intervals.
    ([60.0], [MAX_STRETCH]),
])
def test_the_pace_stretches_while_cycles_do_not_fit(durations: list[float], paces: list[float]) -> None:
    pacer = Pacer(1.0)
    # Each cycle with a loop lag of a third of the interval: lagwatch is still late.
    assert [round(pacer.observe(d, loop_lag=0.3).interval, 3) for d in durations] == paces
    assert pacer.pace.overloaded == (paces[-1] > 1.0)


def test_the_pace_is_back_at_once_when_lagwatch_is_on_time_again() -> None:
    pacer = Pacer(1.0)
    assert pacer.observe(2.5, loop_lag=1.2).interval == pytest.approx(3.2)
    assert pacer.observe(0.3, loop_lag=0.05).interval == 1.0  # fits, and on time: the host is no longer busy
    assert not pacer.pace.overloaded


# -- the rule where a cycle applies it -------------------------------------------------------

CONFIG = parse_config({"interval": "500ms", "query_timeout": "150ms", "clusters": [{
    "name": "main", "primary": {"dsn": "host=p"}, "replicas": [{"name": "replica1", "dsn": "host=r1"}]}]})
CAPS = Capabilities(version_num=180001, in_recovery=True, has_walinspect=False,
                    can_walinspect=False, can_read_all_stats=True)


class _Pgconn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.finished = sock, False

    @property
    def socket(self) -> int:
        return self.sock.fileno()

    def is_busy(self) -> bool:
        return True  # a statement under way, its result not whole yet

    def finish(self) -> None:
        self.finished = True


class _Conn:
    def __init__(self, sock: socket.socket) -> None:
        self.pgconn, self.closed = _Pgconn(sock), False

    async def close(self) -> None:
        self.closed = True


class SocketNode(NodePoller):
    """A replica whose session is one end of a socket pair. ``answers``: its statement
    returns at once; else it hangs (as one whose answer is still being read would) while
    whatever the test wrote waits on the socket."""

    def __init__(self, context: SessionContext) -> None:
        cluster = CONFIG.clusters[0]
        super().__init__(cluster, "replica1", "replica", cluster.replicas[0], CONFIG, context)
        self.ours, self.theirs = socket.socketpair()
        self.stub = _Conn(self.ours)
        self.answers = True

    async def _connection(self) -> Any:
        if self._session.conn is None:
            self._session.conn = self.stub  # type: ignore[assignment]
            self._connects += 1
        self._caps = CAPS
        return self._session.conn

    async def _query(self, conn: Any, caps: Capabilities, board: Any, deadline: float) -> NodeObservation:
        if not self.answers:
            await asyncio.get_running_loop().create_future()  # never done
        return NodeObservation(cluster="main", node=self.node, role=self.role, observed_at=0.0, duration=0.0,
                               capabilities=caps, position=ServerPosition(True, None, 100, 100, "not paused", 1.0))


class SlowExtrasPrimary(SocketNode):
    """A primary that answers its views at once, then spends its extra reads (pg_walinspect's,
    extrareads.py) past the cycle's budget: a server slow under load, not a dead one."""

    def __init__(self, context: SessionContext) -> None:
        super().__init__(context)
        self.node, self.role = "primary", "primary"
        self.slow = False

        async def read(conn: Any, caps: Capabilities) -> ViewsRead:
            position = ServerPosition(False, 100, None, None, None, None)
            return ViewsRead({"server": position}, {}, {})

        async def inspect(*args: Any) -> None:
            if self.slow:
                await asyncio.sleep(10 * CONFIG.cycle_budget)

        self._reader.read = read  # type: ignore[method-assign]
        self._extras.inspect = inspect  # type: ignore[method-assign]

    async def _query(self, conn: Any, caps: Capabilities, board: Any, deadline: float) -> NodeObservation:
        return await NodePoller._query(self, conn, caps, board, deadline)


def test_a_node_that_answered_is_never_silent_while_lagwatchs_extra_reads_go_on() -> None:
    """Its views answered, the primary's poll goes on with lagwatch's own extra reads, slow
    on a busy server: the cycle that stops waiting reads it late (no evidence), never down."""
    budget = CONFIG.cycle_budget

    async def scenario() -> NodeObservation:
        context = SessionContext()
        context.loop_lag.start()
        primary = SlowExtrasPrimary(context)
        [first] = await poll_all([primary], budget)
        assert first.ok, first
        primary.slow = True
        [late] = await poll_all([primary], budget)
        await primary.close()
        context.loop_lag.stop()
        return late

    late = asyncio.run(scenario())
    assert (late.pending, late.error_kind) == ("late", None), late


def test_a_statement_the_server_cancelled_at_its_timeout_is_a_slow_node_not_a_down_one() -> None:
    """The poll's statement cancelled by the node's statement_timeout (a busy host): it is
    there and said so. The cycle reads it late (no evidence either way) and keeps its
    session: reading it down, or reconnecting, is the spiral a busy host must not start."""

    class Cancelling(SocketNode):
        async def _query(self, conn: Any, caps: Capabilities, board: Any, deadline: float) -> NodeObservation:
            if not self.answers:
                raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
            return await super()._query(conn, caps, board, deadline)

    async def scenario() -> tuple[NodeObservation, bool, int]:
        context = SessionContext()
        context.loop_lag.start()
        node = Cancelling(context)
        [first] = await poll_all([node], CONFIG.cycle_budget)
        assert first.ok, first
        node.answers = False
        [slow] = await poll_all([node], CONFIG.cycle_budget)
        kept = node._session.conn is not None and not node.stub.pgconn.finished
        await node.close()
        context.loop_lag.stop()
        return slow, kept, node._connects

    slow, kept, connects = asyncio.run(scenario())
    assert (slow.pending, slow.error_kind) == ("late", None), slow
    assert kept and connects == 1


class BusyNeighbour(NodePoller):
    """Another node whose poll, once started, holds the event loop for ``hold`` seconds:
    lagwatch itself busy (or descheduled by a busy host)."""

    def __init__(self, hold: float) -> None:
        cluster = CONFIG.clusters[0]
        super().__init__(cluster, "primary", "primary", cluster.primary, CONFIG)
        self.hold = hold

    async def poll(self, board: object = None) -> NodeObservation:
        await asyncio.sleep(0)
        time.sleep(self.hold)
        return NodeObservation(cluster="main", node="primary", role="primary", observed_at=time.monotonic(),
                               duration=self.hold)


@pytest.mark.parametrize("node,lagwatch,pending,error_kind,closed", [
    # Down, and its socket closed at its deadline.
    ("silent", "on time", None, "timeout", True),
    # No evidence: its answer waits, and so does its session, however long lagwatch waits then.
    ("answered", "late", "late", None, False),
    # Both: no evidence either way. Its session is closed only once lagwatch has listened
    # for its whole deadline after the stall, and heard nothing.
    ("silent", "late", "late", None, True),
    # Answered, not yet taken: not silent.
    ("answered", "on time", "late", None, False),
])
def test_a_cycle_reads_a_node_down_only_for_a_silence_lagwatch_was_there_to_hear(
        node: str, lagwatch: str, pending: str | None, error_kind: str | None, closed: bool) -> None:
    budget = CONFIG.cycle_budget

    async def scenario() -> tuple[NodeObservation, bool]:
        context = SessionContext()
        context.loop_lag.start()
        scripted = SocketNode(context)
        [first] = await poll_all([scripted], budget)  # one answer: this is not a first connection
        assert first.ok, first
        scripted.answers = False
        if node == "answered":
            scripted.theirs.send(b"D")  # its answer's bytes, on the socket
        others = [BusyNeighbour(2 * budget)] if lagwatch == "late" else []
        [*_, observation] = await poll_all([*others, scripted], budget)
        assert not scripted.stub.pgconn.finished or not others  # a late cycle closes nothing
        await asyncio.sleep(0.05)
        await poll_all([scripted], budget)  # lagwatch on time: over its 0.15 s deadline now
        finished = scripted.stub.pgconn.finished
        await scripted.close()
        context.loop_lag.stop()
        return observation, finished

    observation, finished = asyncio.run(scenario())
    assert (observation.pending, observation.error_kind) == (pending, error_kind), observation
    assert finished == closed
