"""A cycle's one statement over libpq directly: send, wait, take the one value.

The poller reads every view of a node in one prepared statement that answers one row of
one text value (views/combined.py), a fleet's 900 nodes once a second each. Through
psycopg's cursor that costs a cursor, its adapters, the prepare manager's bookkeeping and
a generator-driven wait per statement: about 40 % of a fleet daemon's CPU, for a statement
that needs none of them (no parameters, no types to load but one text). Here it is the
libpq calls psycopg makes itself (``psycopg.pq``, its public libpq wrapper, on the
connection psycopg opened and still owns for everything else), one future and one reader
registration per wait. Hand-written because no library offers "execute a prepared
statement and give me its bytes" on an asyncio loop cheaper than a cursor does.

The connection must be idle and in psycopg's non-blocking mode (every psycopg connection
is), and no other coroutine may use it meanwhile (a poller owns its connection).
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from psycopg import pq
from psycopg.errors import error_from_result

__all__ = ["execute_prepared", "prepare"]


async def prepare(conn: psycopg.AsyncConnection[Any], name: bytes, sql: bytes) -> None:
    """``PREPARE name AS sql`` (the protocol's Parse message): raises the server's error,
    as psycopg would (a ``psycopg.Error`` subclass by SQLSTATE)."""
    pgconn = conn.pgconn
    pgconn.send_prepare(name, sql)
    await _results(conn, pgconn)


async def execute_prepared(conn: psycopg.AsyncConnection[Any], name: bytes) -> bytes | None:
    """Run the prepared statement ``name`` (no parameters, text results) and return the
    first column of its first row, None if SQL NULL or no row."""
    pgconn = conn.pgconn
    pgconn.send_query_prepared(name, None)
    result = await _results(conn, pgconn)
    if result is None or result.ntuples == 0:
        return None
    return result.get_value(0, 0)


async def _results(conn: psycopg.AsyncConnection[Any], pgconn: pq.abc.PGconn) -> pq.abc.PGresult | None:
    """Flush what was sent and read every result until libpq has none left (the last
    one is the statement's; an error result raises once all are read, so the connection
    is idle again for the next statement)."""
    loop = asyncio.get_running_loop()
    fd = pgconn.socket
    if pgconn.flush():  # only if the socket's buffer was full: wait until it drains
        await _wait(loop, fd, pgconn, flushing=True)
    last: pq.abc.PGresult | None = None
    error: pq.abc.PGresult | None = None
    while True:
        if pgconn.is_busy():
            await _wait(loop, fd, pgconn, flushing=False)
            continue
        result = pgconn.get_result()
        if result is None:
            break
        if result.status == pq.ExecStatus.FATAL_ERROR:
            error = error or result
        else:
            last = result
    if error is not None:
        raise error_from_result(error, encoding=conn.info.encoding)
    return last


async def _wait(loop: asyncio.AbstractEventLoop, fd: int, pgconn: pq.abc.PGconn, flushing: bool) -> None:
    """Until libpq has a whole result to give (reading what the socket has into its
    buffer) or, ``flushing``, has sent all it holds (reading too meanwhile, as libpq asks,
    so that a server blocked on writing to us never waits on us). Raises libpq's error
    (an ``OperationalError``) if the connection broke."""
    future: asyncio.Future[None] = loop.create_future()

    def on_event() -> None:
        if future.done():
            return
        try:
            pgconn.consume_input()
            if pgconn.flush() if flushing else pgconn.is_busy():
                return
        except psycopg.Error as exc:
            future.set_exception(exc)
        else:
            future.set_result(None)

    loop.add_reader(fd, on_event)
    if flushing:
        loop.add_writer(fd, on_event)
    try:
        await future
    finally:
        loop.remove_reader(fd)
        if flushing:
            loop.remove_writer(fd)
