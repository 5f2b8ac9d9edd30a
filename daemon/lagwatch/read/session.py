"""One long-lived PostgreSQL session whose deadlines count lagwatch's attention, not the wall clock.

Every session lagwatch keeps (a node's poller, a leader-lock session) runs its statements
and its connection attempts through a ``Session``: at most ``CONNECTS_AT_ONCE`` attempts
are under way at any moment (a restarted lagwatch or server with hundreds of sessions to
make does not stampede), and an operation past its deadline is ended only if lagwatch
gave it the whole deadline of its attention (``lateness.LoopLag``) and no answer is
waiting for it. A deadline that passed while lagwatch was the late one closes nothing.

The deadlines are enforced from outside, by whoever stops waiting for the operation
(``expire_overdue``): no timer per statement (a fleet's loop would keep hundreds in its
heap), one check per session and cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import select
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import psycopg

from lagwatch.estimate.lateness import LoopLag, Verdict, judge_unanswered

T = TypeVar("T")
# Connection attempts under way at once across one daemon: 900 sessions made 32 at a time
# over loopback take well under a second; a server restarting under a fleet is not hit
# by hundreds of forks at once.
CONNECTS_AT_ONCE = 32


class SessionContext:
    """What every session of one daemon shares: the loop-lag meter and the connect gate."""

    def __init__(self, connects_at_once: int = CONNECTS_AT_ONCE) -> None:
        self.loop_lag = LoopLag()
        self.gate = asyncio.Semaphore(connects_at_once)


@dataclass(frozen=True)
class _Operation:
    kind: Literal["connect", "ask"]
    since: tuple[float, float]  # LoopLag.mark when it began
    timeout: float  # seconds of attention it may take
    task: asyncio.Task[Any]


class Session:
    """A psycopg connection, its attempts gated, its operations' deadlines in attention."""

    def __init__(self, context: SessionContext) -> None:
        self.context = context
        self.conn: psycopg.AsyncConnection[Any] | None = None
        self._op: _Operation | None = None
        self._expired = False

    @property
    def open(self) -> bool:
        return self.conn is not None and not self.conn.closed

    async def connect(self, conninfo: str, timeout: float, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
        """Open the connection (waiting for a turn at the gate first: the deadline counts
        from the turn). Raises TimeoutError when ``expire_overdue`` ended the attempt."""
        async with self.context.gate:
            self.conn = await self._guarded("connect", psycopg.AsyncConnection.connect(conninfo, **kwargs), timeout)
            return self.conn

    async def ask(self, operation: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``operation`` on the open connection with a deadline of ``timeout`` seconds
        of attention. Raises TimeoutError if ``expire_overdue`` ended it (the connection
        is then closed: its socket first, so psycopg has no server to ask to cancel)."""
        return await self._guarded("ask", operation, timeout)

    async def _guarded(self, kind: Literal["connect", "ask"], operation: Coroutine[Any, Any, T],
                       timeout: float) -> T:
        task = asyncio.current_task()
        assert task is not None
        loop_lag = self.context.loop_lag
        self._op, self._expired = _Operation(kind, loop_lag.mark(time.monotonic()), timeout, task), False
        try:
            result = await operation
        except asyncio.CancelledError:
            if self._expired and task.uncancel() == 0:
                raise TimeoutError from None
            raise
        except psycopg.Error:
            if not self._expired:
                raise
            await _take_cancellation(task)  # the closed socket spoke first: the cancel is still due
            raise TimeoutError from None
        finally:
            self._op = None
        if self._expired:  # done in the very step the deadline was enforced: the connection is closed
            await _take_cancellation(task)
            raise TimeoutError
        return result

    def answer_waiting(self) -> bool:
        """Whether the operation under way has an answer lagwatch has not got to: bytes on
        its socket, or a whole result libpq holds. Never true while connecting (psycopg
        keeps that socket to itself)."""
        op, conn = self._op, self.conn
        if op is None or op.kind != "ask" or conn is None or conn.closed:
            return False
        pgconn = conn.pgconn
        try:
            if not pgconn.is_busy():
                return True
            readable, _, _ = select.select([pgconn.socket], [], [], 0)
        except (psycopg.Error, OSError, ValueError):
            return False
        return bool(readable)

    def attentive(self, now: float) -> float:
        """Seconds of lagwatch's attention the operation under way has had (0: none under way)."""
        op = self._op
        return self.context.loop_lag.attentive(op.since, now) if op is not None else 0.0

    def judge(self, now: float, budget: float, first_connection: bool) -> Verdict:
        """Why the operation under way has not finished within a cycle's ``budget``."""
        return judge_unanswered(first_connection=first_connection, answer_waiting=self.answer_waiting(),
                                attentive=self.attentive(now), budget=budget)

    def expire_overdue(self, now: float) -> bool:
        """End the operation under way if it has had its whole deadline of lagwatch's
        attention and no answer is waiting for it; returns whether it did."""
        op = self._op
        if op is None or self._expired or self.attentive(now) < op.timeout or self.answer_waiting():
            return False
        self._expired = True
        if op.kind == "ask":
            self.drop()
        op.task.cancel()
        return True

    def drop(self) -> None:
        """Close the socket without a round trip (the server ends the session on its own)."""
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.pgconn.finish()

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                await asyncio.wait_for(conn.close(), 1.0)
            except (TimeoutError, psycopg.Error, OSError):
                pass


class Outlasting(Generic[T]):
    """Work on a session that may outlive the cycle that started it (a node's poll, a lock
    round trip): each cycle takes the one still under way, or the one that ended after its
    cycle stopped waiting (its outcome is used now), or else starts a new one."""

    def __init__(self) -> None:
        self.current: asyncio.Future[T] | None = None
        self._used = True

    def start(self, work: Callable[[], Coroutine[Any, Any, T]]) -> asyncio.Future[T]:
        if self.current is None or (self.current.done() and self._used):
            self.current = asyncio.ensure_future(work())
            self._used = False
        return self.current

    def take(self, done: asyncio.Future[T]) -> T:
        """The outcome of ``done`` (from ``start``), which the next ``start`` will not give again."""
        if done is self.current:
            self._used = True
        return done.result()

    async def cancel(self) -> None:
        current, self.current = self.current, None
        if current is not None and not current.done():
            current.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await current


def reconnect_delay(failures: int, interval: float, backoff_max: float, draw: float | None = None) -> float:
    """How long to wait before the next attempt after ``failures`` failures in a row: at
    once after the first, then 1, 2, 4 ... intervals up to ``backoff_max``, each drawn
    between half and all of that ("equal jitter"), so that the hundreds of nodes a
    restarted server takes down do not all come back at the same instant, cycle after
    cycle. ``draw``: the random share (0-1), for tests."""
    if failures <= 1:
        return 0.0
    ceiling: float = min(backoff_max, interval * 2.0 ** (failures - 2))
    share = random.random() if draw is None else draw
    return ceiling * (0.5 + 0.5 * share)


async def _take_cancellation(task: asyncio.Task[Any]) -> None:
    """Receive a cancellation requested of ``task`` (the current one) and withdraw it."""
    try:
        await asyncio.sleep(0)
    except asyncio.CancelledError:
        task.uncancel()
