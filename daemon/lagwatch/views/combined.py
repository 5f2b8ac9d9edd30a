"""All of a node's per-cycle views in one statement: one row, one JSON object.

Each view keeps its own SQL and parser (its module); this only wraps them, so that a poll
is one statement, one round trip and one value to decode rather than one per view: the
client's per-statement cost (and the server's) is what a fleet of hundreds of nodes pays
every second. The object has one key per view, whose value is the view's rows as a JSON
array of objects, which the view's parser reads as it reads rows (every column lagwatch
reads is text, a number, a boolean or NULL, which JSON carries unchanged). If any view
fails the whole statement does, and the poller falls back to reading them one by one to
find which (poll.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lagwatch.views import heartbeat
from lagwatch.views.base import View
from lagwatch.views.probe import Capabilities

# (view names, version, the SQL of views whose SQL is not the version's alone) -> statement.
# Bytes, not str: psycopg would encode a str at every execute, and each connection's
# prepared-statement cache keeps its key, so a fleet of 900 connections held 900 copies of
# the same few kilobytes; bytes pass through as they are.
_CACHE: dict[tuple[tuple[str, ...], int, tuple[str | None, ...]], bytes] = {}


def combined_sql(views: Sequence[View[Any]], caps: Capabilities) -> bytes:
    """The one statement that reads ``views`` on the connection ``caps`` was probed on: each
    view's SQL for its server's version and what the probe learnt (View.sql); built once per
    set of views and SQL, since every poll asks for it."""
    # A cluster's own views (the heartbeat's table and row) differ by their SQL, not their
    # name; so do the views whose SQL the probe chooses.
    key = (tuple(v.name for v in views), caps.version_num,
           tuple(v.sql(caps) for v in views if v.name == heartbeat.NAME or v.queries_for is not None))
    statement = _CACHE.get(key)
    if statement is None:
        pairs = []
        for view in views:
            query = view.sql(caps)
            assert query is not None
            # coalesce: a view with no rows is an empty list, never NULL.
            pairs.append(f"'{view.name}', (SELECT coalesce(json_agg(v), '[]'::json) FROM ({query}) v)")
        statement = _CACHE[key] = ("SELECT json_build_object(" + ",\n".join(pairs) + ")").encode()
    return statement


def parse_combined(views: Sequence[View[Any]], value: Mapping[str, Any]) -> dict[str, Any]:
    """Each view's value from the combined statement's one JSON object."""
    return {view.name: view.parse(value[view.name]) for view in views}
