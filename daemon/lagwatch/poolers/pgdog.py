"""PgDog: the ``role = "replica"`` ``[[databases]]`` tables of one database in ``pgdog.toml``.

The tables with ``name = "app"`` and ``role = "replica"`` are pool ``app``'s read pool
(``role`` defaults to primary, ``port`` to 5432, ``shard`` to 0; other shards and
``role = "auto"`` are refused)::

    [[databases]]
    name = "app"
    host = "10.0.0.2"
    port = 5432
    role = "replica"
    database_name = "app_prod"

A replica that leaves loses its table, with the comment lines directly above its header;
comments after its keys that lead to what follows stay where they were. A replica that
joins gets a new table after the pool's last one, copying the key lines of the pool's
first replica table (``database_name``, ``user``, ``shard``...; not its comments) with
host, port and role set. With no replica table, the pool's first table (the primary's)
is copied instead: a replica written with only ``name``/``host``/``port``/``role`` would
lose the primary's ``database_name`` and ``user`` and serve the wrong database.

tomlkit files the comments and blank lines between two tables under the first one, so
this module moves them by hand (the ``_tail`` helpers) to keep them next to what they
were written above.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tomlkit
import tomlkit.items
from tomlkit.items import Comment, Item, Key, Table, Whitespace

from lagwatch.config import TomlPoolerConfig
from lagwatch.poolers import toml_file
from lagwatch.poolers.base import Backend, PoolerError
from lagwatch.poolers.command import DEFAULT_PORT
from lagwatch.poolers.toml_file import Address, TomlFilePooler, norm

Body = list[tuple[Key | None, Item]]


class PgDogFormat:
    title = "PgDog"

    def _tables(self, data: Mapping[str, Any], pool: str) -> list[tuple[int, Address, str]]:
        """The ``[[databases]]`` tables of ``pool``, checked: [(index, (host, port), role)]."""
        databases = data.get("databases", [])
        if not isinstance(databases, list) or not all(isinstance(d, dict) for d in databases):
            raise PoolerError("PgDog config: databases is not a list of [[databases]] tables")
        out = []
        for index, table in enumerate(databases):
            if table.get("name") != pool:
                continue
            host, port = table.get("host"), table.get("port", DEFAULT_PORT)
            role, shard = table.get("role", "primary"), table.get("shard", 0)
            if not isinstance(host, str) or not isinstance(port, int) or isinstance(port, bool):
                raise PoolerError(f"PgDog database {pool!r} (entry {index + 1}): host must be a string "
                                  "and port an integer")
            if shard != 0:
                raise PoolerError(f"PgDog database {pool!r} has shard {shard!r} entries: "
                                  "lagwatch only manages single-shard databases (shard 0)")
            if role not in ("primary", "replica"):
                raise PoolerError(f"PgDog database {pool!r} ({host}:{port}) has role {role!r}: "
                                  'lagwatch needs explicit "primary"/"replica" roles')
            out.append((index, (host, port), str(role)))
        if not out:
            raise PoolerError(f"PgDog config has no [[databases]] entry with name = {pool!r}")
        return out

    def replicas(self, data: Mapping[str, Any], pool: str) -> list[Address]:
        return [address for _, address, role in self._tables(data, pool) if role == "replica"]

    def without_replicas(self, data: dict[str, Any], pool: str) -> dict[str, Any]:
        data = dict(data)
        data["databases"] = [d for d in data.get("databases", [])
                             if not (d.get("name") == pool and d.get("role") == "replica")]
        return data

    def edit(self, doc: tomlkit.TOMLDocument, pool: str, remove: Sequence[Address], add: Sequence[Address]) -> None:
        aot = doc.get("databases")
        if not isinstance(aot, tomlkit.items.AoT) or any(
                not isinstance(t, Table) or any(isinstance(v, (Table, tomlkit.items.AoT)) for v in t.values())
                for t in aot):
            raise PoolerError("PgDog config: only [[databases]] tables (no inline or sub-table forms) are supported")
        mine = [i for i, t in enumerate(aot) if t.get("name") == pool]
        replicas = [i for i in mine if t_role(aot[i]) == "replica"]
        template = _template(aot[replicas[0] if replicas else mine[0]])
        gone = {norm(a) for a in remove}
        for i in reversed(replicas):
            if norm(_address(aot[i])) in gone:
                _remove(aot, i)
        if add:
            last = max(i for i, t in enumerate(aot) if t.get("name") == pool)
            _insert_after(doc, aot, last, [_new_table(template, host, port) for host, port in add])


def t_role(table: Table) -> str:
    return str(table.get("role", "primary"))


def _address(table: Table) -> Address:
    return str(table["host"]), int(table.get("port", DEFAULT_PORT))


def _tail_start(body: Body) -> int:
    """Where a table's tail starts: the comments and blank lines after its last key."""
    return max((i for i, (key, _) in enumerate(body) if key is not None), default=-1) + 1


def _split_tail(body: Body) -> tuple[Body, Body]:
    """A table's tail as (its own: up to its first blank line; the rest, which leads to
    whatever follows the table)."""
    tail = body[_tail_start(body):]
    blank = next((n for n, (_, item) in enumerate(tail) if isinstance(item, Whitespace)), None)
    return (tail, []) if blank is None else (tail[:blank + 1], tail[blank + 1:])


def _remove(aot: tomlkit.items.AoT, i: int) -> None:
    """Delete table ``i`` with the comments right above its header; the comments and
    blank lines after its own first blank line stay, before what followed it."""
    _, leading_on = _split_tail(aot[i].value.body)
    del aot[i]
    if i > 0:
        body = aot[i - 1].value.body
        while len(body) > _tail_start(body) and isinstance(body[-1][1], Comment):
            body.pop()  # the removed table's header comment
        body.extend(leading_on)
    elif leading_on:
        if i >= len(aot):
            raise PoolerError("PgDog config: cannot remove the only [[databases]] table with comments after it")
        nxt = aot[i]
        nxt.trivia.indent = "".join(item.as_string() for _, item in leading_on) + nxt.trivia.indent


def _insert_after(doc: tomlkit.TOMLDocument, aot: tomlkit.items.AoT, last: int, tables: list[Table]) -> None:
    """Insert ``tables`` after table ``last``: between its keys (and own tail) and the
    comments that lead from it to what follows, which move after the new tables."""
    anchor = aot[last].value.body
    _, leading_on = _split_tail(anchor)
    del anchor[len(anchor) - len(leading_on):]
    before = aot[last].as_string()
    follows = bool(leading_on) or last + 1 < len(aot) or list(doc.keys())[-1] != "databases"
    for n, table in enumerate(tables):
        if n:
            table.trivia.indent = "\n"
        elif not before.endswith("\n"):
            table.trivia.indent = "\n\n"  # the file ended without a newline
        elif not before.endswith(("\n\n", "\n\r\n")):
            table.trivia.indent = "\n"
        aot.insert(last + 1 + n, table)
    closing = tables[-1].value.body
    if follows:
        closing.append((None, Whitespace("\n")))
    closing.extend(leading_on)


def _template(table: Table) -> list[tuple[str, Any]]:
    """The key lines of ``table`` as (key, value), with port and role present."""
    keys = [(str(k), v.unwrap() if isinstance(v, Item) else v) for k, v in table.items()]
    for key, after, value in (("port", "host", DEFAULT_PORT), ("role", "port", "replica")):
        if not any(k == key for k, _ in keys):
            at = next((n + 1 for n, (k, _) in enumerate(keys) if k == after), len(keys))
            keys.insert(at, (key, value))
    return keys


def _new_table(template: list[tuple[str, Any]], host: str, port: int) -> Table:
    table = tomlkit.table()
    for key, value in template:
        table.add(key, {"host": host, "port": port, "role": "replica"}.get(key, value))
    return table


FORMAT = PgDogFormat()


def render(text: str, pool: str, replicas: Sequence[Backend]) -> str:
    """``text`` (a pgdog.toml) with the ``role = "replica"`` tables of ``pool`` set to ``replicas``."""
    return toml_file.render(FORMAT, text, pool, replicas)


def replica_addresses(text: str, pool: str) -> list[Address]:
    """The replicas (host, port) of ``pool`` in file order."""
    return FORMAT.replicas(toml_file.loads(text, "PgDog config"), pool)


def pooler(config: TomlPoolerConfig, backends: Mapping[str, Backend], timeout: float = 10.0) -> TomlFilePooler:
    """The PgDog adapter."""
    return TomlFilePooler(FORMAT, config, backends, timeout)
