"""The heartbeat table's shape rule (heartbeattable.shape_problems), one row per case: what
the shipped SQL makes passes; each thing that would run code as lagwatch's role, or let a
stranger add it later, is named. And how the writer (heartbeat.py) says a failure of its
own: the real-server cases are in tests/integration/test_heartbeat_writer.py."""

from __future__ import annotations

from typing import Any

import pytest
from lagwatch.read.heartbeattable import shape_problems

AS_SHIPPED: dict[str, Any] = {
    "relkind": "r", "row_security": False, "schema": "lagwatch", "table_owner": "postgres", "table_trusted": True,
    "schema_owner": "postgres", "schema_trusted": True, "seq_type": "bigint", "other_columns": None,
    "triggers": None, "rules": None, "constraints": None, "indexes": None,
}


@pytest.mark.parametrize(("change", "said"), [
    ({}, None),
    ({"relkind": "v"}, "it is not a plain table (relkind 'v')"),
    ({"relkind": "p"}, "it is not a plain table (relkind 'p')"),
    ({"seq_type": "numeric"}, "its seq column is numeric, not bigint"),
    ({"seq_type": None}, "no seq column, not bigint"),
    ({"other_columns": ["id", "at"]}, "columns other than id text and seq bigint: id, at"),
    ({"triggers": ["steal"]}, "triggers: steal"),
    ({"rules": ["r1", "r2"]}, "rules: r1, r2"),
    ({"constraints": ["seq_check"]}, "constraints other than its keys: seq_check"),
    ({"indexes": ["lagwatch.by_fn"]}, "indexes on expressions or with predicates: lagwatch.by_fn"),
    ({"row_security": True}, "row security is on (its policies run as lagwatch's role)"),
    ({"table_trusted": False, "table_owner": "mallory"}, "it is owned by mallory, who may put code on it"),
    ({"schema_trusted": False, "schema_owner": "mallory"},
     "its schema lagwatch is owned by mallory, who may replace it"),
])
def test_the_shape_rule(change: dict[str, Any], said: str | None) -> None:
    assert shape_problems({**AS_SHIPPED, **change}) == ([] if said is None else [said])


def test_every_problem_is_said_at_once() -> None:
    problems = shape_problems({**AS_SHIPPED, "triggers": ["t"], "table_trusted": False, "table_owner": "m"})
    assert problems == ["triggers: t", "it is owned by m, who may put code on it"]


def test_an_internal_error_is_said_with_its_traceback_once_an_outage(monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A bug in the writer (here: every attempt raises RuntimeError) is counted on each
    attempt, its traceback logged once, not once per retry (before: one per retry, 2,880
    a day at the 30 s retry)."""
    import asyncio

    import lagwatch.read.heartbeat as heartbeat
    from lagwatch.config import parse_config

    config = parse_config({"clusters": [{"name": "main", "primary": {"dsn": "host=127.0.0.1 port=1"},
                                         "heartbeat": {"interval": "1s"}}]})
    writer = heartbeat.HeartbeatWriter(config.clusters[0], config)
    attempts = 0

    async def broken() -> None:
        nonlocal attempts
        attempts += 1
        raise RuntimeError("a bug")

    monkeypatch.setattr(writer, "_beat_while_connected", broken)
    monkeypatch.setattr(heartbeat, "RETRY_MAX", 0.001)

    async def run() -> None:
        writer.ensure_started()
        while attempts < 5:
            await asyncio.sleep(0.001)
        await writer.close()

    asyncio.run(run())
    assert writer.log.failed >= 5
    tracebacks = [r for r in caplog.records if r.exc_info is not None]
    assert len(tracebacks) == 1 and "internal error" in tracebacks[0].getMessage()
    assert sum("cannot write the heartbeat" in r.getMessage() for r in caplog.records) == 1
