"""The cycle's statement over libpq directly (lagwatch/read/wire.py), against a real server:
its value, the server's errors as psycopg raises them with the connection still usable,
a value larger than a socket's buffer, a connection killed mid-statement, a prepared
statement dropped from under the poller, and the walsenders' names read once each."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from lagwatch.config import parse_config
from lagwatch.demo.binaries import find_binaries
from lagwatch.demo.cluster import LocalCluster
from lagwatch.read import wire
from lagwatch.read.poll import NodePoller

pytestmark = pytest.mark.one_pg_version  # the protocol's extended query is the same on every version


def primary_poller(server: LocalCluster) -> NodePoller:
    """The daemon's poller of a one-node cluster on ``server``'s primary."""
    config = parse_config({"interval": "1s", "clusters": [
        {"name": "main", "primary": {"dsn": server.primary.dsn()}, "replicas": []}]})
    cluster = config.clusters[0]
    return NodePoller(cluster, "primary", "primary", cluster.primary, config)


@pytest.fixture(scope="module")
def server(pg_major: int) -> Iterator[LocalCluster]:
    with LocalCluster(find_binaries(pg_major), replicas=1) as cluster:
        yield cluster


def test_a_prepared_statement_answers_and_an_error_leaves_the_connection_ready(server: LocalCluster) -> None:
    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(server.primary.dsn(), autocommit=True) as conn:
            await wire.prepare(conn, b"answer", b"SELECT json_build_object('n', 41 + 1)::text")
            assert await wire.execute_prepared(conn, b"answer") == b'{"n" : 42}'
            # Fails only when run (the division is by a count, planned at execute).
            await wire.prepare(conn, b"fails", b"SELECT (1 / (count(*) - count(*)))::text FROM pg_class")
            with pytest.raises(psycopg.errors.DivisionByZero):
                await wire.execute_prepared(conn, b"fails")
            with pytest.raises(psycopg.errors.SyntaxError):
                await wire.prepare(conn, b"bad", b"SELEKT 1")
            with pytest.raises(psycopg.errors.InvalidSqlStatementName):
                await wire.execute_prepared(conn, b"never_prepared")
            # Each error was read to its end: the connection is idle, for wire and psycopg alike.
            assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
            assert await wire.execute_prepared(conn, b"answer") == b'{"n" : 42}'
            assert await (await conn.execute("SELECT 7")).fetchone() == (7,)
            await wire.prepare(conn, b"nothing", b"SELECT NULL::text")
            assert await wire.execute_prepared(conn, b"nothing") is None

    asyncio.run(scenario())


def test_a_value_larger_than_the_socket_buffer_arrives_whole(server: LocalCluster) -> None:
    async def scenario() -> bytes | None:
        async with await psycopg.AsyncConnection.connect(server.primary.dsn(), autocommit=True) as conn:
            await wire.prepare(conn, b"big", b"SELECT repeat('ab', 3 * 1024 * 1024) || 'end'")
            return await wire.execute_prepared(conn, b"big")

    value = asyncio.run(scenario())
    assert isinstance(value, bytes) and len(value) == 6 * 1024 * 1024 + 3 and value.endswith(b"abend")


def test_a_connection_killed_mid_statement_raises_operational_error_at_once(server: LocalCluster) -> None:
    async def scenario() -> float:
        async with await psycopg.AsyncConnection.connect(server.primary.dsn(), autocommit=True) as conn:
            await wire.prepare(conn, b"slow", b"SELECT pg_sleep(20)::text")
            statement = asyncio.ensure_future(wire.execute_prepared(conn, b"slow"))
            await asyncio.sleep(0.3)
            assert not statement.done()
            loop = asyncio.get_running_loop()
            started = loop.time()
            server.primary.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
            with pytest.raises(psycopg.OperationalError):
                await asyncio.wait_for(statement, 5)
            return loop.time() - started

    assert asyncio.run(scenario()) < 2.0  # noticed when the socket closes, not when pg_sleep would end


def test_the_poller_prepares_its_statement_again_when_the_session_lost_it(server: LocalCluster) -> None:
    """A pooler's DISCARD ALL (or a DEALLOCATE) drops the cycle's prepared statement: that
    cycle still answers (the views read one by one) and the next prepares it again."""

    async def scenario() -> tuple[list[str], list[bool], list[str]]:
        poller = primary_poller(server)
        try:
            answers = [(await poller.poll()).ok]
            conn = poller.connection
            assert conn is not None
            names_before = [r["name"] for r in await (await conn.execute(
                "SELECT name FROM pg_prepared_statements WHERE name LIKE 'lagwatch%'")).fetchall()]
            await conn.execute("DEALLOCATE ALL")
            answers += [(await poller.poll()).ok, (await poller.poll()).ok]
            assert poller.connection is conn  # the same session throughout
            names_after = [r["name"] for r in await (await conn.execute(
                "SELECT name FROM pg_prepared_statements WHERE name LIKE 'lagwatch%'")).fetchall()]
            return names_before, answers, names_after
        finally:
            await poller.close()

    before, answers, after = asyncio.run(scenario())
    assert before == ["lagwatch_cycle_0"]
    assert answers == [True, True, True]
    assert after == ["lagwatch_cycle_1"]  # a name is never reused on a session (see below)


def test_a_lost_statement_is_prepared_again_beside_one_the_session_kept(server: LocalCluster) -> None:
    """Two statements on the session (every view; one resting, as after a view failed),
    only the second deallocated: the poller prepares it again under a new name, rather
    than reusing the first name the session still holds and reading one by one for good."""

    async def names(conn: psycopg.AsyncConnection[Any]) -> list[str]:
        rows = await (await conn.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE 'lagwatch%' "
                                         "ORDER BY name")).fetchall()
        return [r["name"] for r in rows]

    async def scenario() -> tuple[list[str], list[bool], list[str]]:
        poller = primary_poller(server)
        try:
            answers = [(await poller.poll()).ok]
            poller._reader.resting["wal_dir"] = time.monotonic() + 60  # the next statement leaves it out
            answers.append((await poller.poll()).ok)
            conn = poller.connection
            assert conn is not None
            two = await names(conn)
            await conn.execute("DEALLOCATE lagwatch_cycle_1")
            answers += [(await poller.poll()).ok for _ in range(3)]
            assert poller.connection is conn
            return two, answers, await names(conn)
        finally:
            await poller.close()

    two, answers, after = asyncio.run(scenario())
    assert two == ["lagwatch_cycle_0", "lagwatch_cycle_1"]
    assert answers == [True] * 5
    assert after == ["lagwatch_cycle_0", "lagwatch_cycle_2"]


def test_a_walsenders_name_is_read_once_and_again_when_it_restarts(server: LocalCluster,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Each cycle reads pg_stat_get_wal_senders(); the session's name and address are read
    by a second statement only for a walsender this connection has not seen: once, and
    again when the replica reconnects under a new pid."""
    from lagwatch.views import replication

    lookups: list[list[int]] = []
    learn = replication.SenderNames.learn

    def counted(self: replication.SenderNames, rows: Any) -> None:
        lookups.append(sorted(r["pid"] for r in rows))
        learn(self, rows)

    monkeypatch.setattr(replication.SenderNames, "learn", counted)

    def walsender_pid() -> int:
        return int(server.primary.execute("SELECT pid FROM pg_stat_replication")[0][0])

    async def scenario() -> list[tuple[str, ...]]:
        poller = primary_poller(server)
        try:
            seen = []
            for _ in range(3):
                seen.append(tuple(s.application_name for s in (await poller.poll()).walsenders))
            old = walsender_pid()
            server.primary.execute(f"SELECT pg_terminate_backend({old})")
            deadline = time.monotonic() + 20
            while not server.primary.execute(f"SELECT 1 FROM pg_stat_replication WHERE pid <> {old}"):
                assert time.monotonic() < deadline, "the replica did not reconnect"
                await asyncio.sleep(0.1)
            for _ in range(2):
                seen.append(tuple(s.application_name for s in (await poller.poll()).walsenders))
            return seen
        finally:
            await poller.close()

    seen = asyncio.run(scenario())
    assert seen == [("replica1",)] * 5
    assert len(lookups) == 2 and lookups[0] != lookups[1], lookups  # once per walsender, not per cycle
    assert lookups[1] == [walsender_pid()]
