"""PgCat: the replica servers of one pool's shard 0 in ``pgcat.toml``, then a reload.

Pool ``app`` looks like this; the entries with role ``"replica"`` are the read pool. Only
shard ``"0"`` is supported: a pool with other shards is refused, as one set of members
cannot describe several shards::

    [pools.app.shards.0]
    servers = [
        [ "10.0.0.1", 5432, "primary" ],
        [ "10.0.0.2", 5432, "replica" ],  # zone b
    ]
    database = "app"

A replica that leaves loses its entry (and the comment on its line); one that joins is
added after the last server, spaced like the existing entries (``[ "h", 5432, "replica" ]``
or ``["h", 5432, "replica"]``); tomlkit keeps the array's layout (one line or one entry a
line, indentation, trailing comma). The table may be written as a section, with dotted
keys or as inline tables.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

import tomlkit
import tomlkit.items

from lagwatch.config import TomlPoolerConfig
from lagwatch.poolers import toml_file
from lagwatch.poolers.base import Backend, PoolerError
from lagwatch.poolers.toml_file import Address, TomlFilePooler, norm


class PgCatFormat:
    title = "PgCat"

    def _servers(self, data: Mapping[str, Any], pool: str) -> list[tuple[str, int, str]]:
        """The ``servers`` of shard 0 of ``pool``, checked: [(host, port, role)]."""
        pools = data.get("pools")
        if not isinstance(pools, Mapping) or not isinstance(pools.get(pool), Mapping):
            raise PoolerError(f"PgCat config has no [pools.{pool}]")
        shards = pools[pool].get("shards")
        if not isinstance(shards, Mapping) or not isinstance(shards.get("0"), Mapping):
            raise PoolerError(f"PgCat pool {pool!r} has no [pools.{pool}.shards.0]")
        others = sorted(k for k in shards if k != "0")
        if others:
            raise PoolerError(f"PgCat pool {pool!r} has shards {', '.join(others)} besides 0: "
                              "lagwatch only manages single-shard pools (shard 0)")
        servers = shards["0"].get("servers")
        if not isinstance(servers, list):
            raise PoolerError(f"PgCat pool {pool!r} shard 0 has no servers array")
        out = []
        for entry in servers:
            if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
                    and isinstance(entry[1], int) and not isinstance(entry[1], bool)
                    and entry[2] in ("primary", "replica")):
                raise PoolerError(f"PgCat pool {pool!r} shard 0: server entry {entry!r} is not "
                                  '[ "host", port, "primary"|"replica" ]')
            out.append((str(entry[0]), int(entry[1]), str(entry[2])))
        return out

    def replicas(self, data: Mapping[str, Any], pool: str) -> list[Address]:
        return [(host, port) for host, port, role in self._servers(data, pool) if role == "replica"]

    def without_replicas(self, data: dict[str, Any], pool: str) -> dict[str, Any]:
        data = copy.deepcopy(data)
        shard = data["pools"][pool]["shards"]["0"]
        shard["servers"] = [s for s in shard["servers"] if s[2] != "replica"]
        return data

    def edit(self, doc: tomlkit.TOMLDocument, pool: str, remove: Sequence[Address], add: Sequence[Address]) -> None:
        servers = doc["pools"][pool]["shards"]["0"]["servers"]
        if not isinstance(servers, tomlkit.items.Array):
            raise PoolerError(f"PgCat pool {pool!r}: servers is not an array")
        gone = {norm(a) for a in remove}
        entries = [(i, e) for i, e in enumerate(servers) if e[2] == "replica"]
        style = entries[0][1] if entries else (servers[0] if len(servers) else None)
        padded = style is None or style.as_string()[1:2] in (" ", "\t", "\r", "\n")
        for i, entry in reversed(entries):
            if norm((str(entry[0]), int(entry[1]))) in gone:
                del servers[i]
        for host, port in add:
            entry = f'{json.dumps(host)}, {port}, "replica"'  # a JSON string is a TOML basic string
            servers.append(tomlkit.parse(f"entry = [ {entry} ]" if padded else f"entry = [{entry}]")["entry"])


FORMAT = PgCatFormat()


def render(text: str, pool: str, replicas: Sequence[Backend]) -> str:
    """``text`` (a pgcat.toml) with the replica servers of ``pool`` shard 0 set to ``replicas``."""
    return toml_file.render(FORMAT, text, pool, replicas)


def replica_addresses(text: str, pool: str) -> list[Address]:
    """The replicas (host, port) of ``pool`` in file order."""
    return FORMAT.replicas(toml_file.loads(text, "PgCat config"), pool)


def pooler(config: TomlPoolerConfig, backends: Mapping[str, Backend], timeout: float = 10.0) -> TomlFilePooler:
    """The PgCat adapter."""
    return TomlFilePooler(FORMAT, config, backends, timeout)
