"""What the PgCat and PgDog adapters share: a pool's replica list kept in a TOML file.

The file is edited with ``tomlkit``, which keeps every byte it is not asked to change
(comments, key order, inline tables, arrays of tables, whitespace, non-ASCII text). Each
format module (``pgcat``, ``pgdog``) reads the pool's replicas and edits them in place:
an entry of a replica that stays is never rewritten, one that leaves is removed, one that
joins is added after the pool's entries, in (host, port) order. The result is then parsed
with ``tomllib`` (the standard parser) and must hold exactly the wanted replicas and be
otherwise equal to the original, or nothing is written. A file whose replica set is
already the wanted one is returned unchanged, so an unchanged pool never causes a write
or a reload. The primary as a fallback member is an ordinary replica entry with the
primary's host and port.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import tomlkit
import tomlkit.exceptions

from lagwatch.config import TomlPoolerConfig
from lagwatch.poolers.base import READ_BACK_EVERY, Backend, PoolerError
from lagwatch.poolers.command import DEFAULT_PORT, read_text, restore, run_reload, write_text

Address = tuple[str, int]  # (host, port) as written in the pooler's file


class TomlFormat(Protocol):
    """One pooler's file format: where a pool's replicas are and how to edit them."""

    title: str  # "PgCat", for messages

    def replicas(self, data: Mapping[str, Any], pool: str) -> list[Address]:
        """The pool's replicas in file order, from ``tomllib`` data; PoolerError if the
        pool is missing or has a shape lagwatch does not manage."""

    def without_replicas(self, data: dict[str, Any], pool: str) -> dict[str, Any]:
        """``data`` (a copy) with the pool's replica entries taken out."""

    def edit(self, doc: tomlkit.TOMLDocument, pool: str, remove: Sequence[Address], add: Sequence[Address]) -> None:
        """Remove the replica entries at ``remove`` and add ``add`` (sorted), in place."""


def norm(address: Address) -> Address:
    """Host names compare case-insensitively."""
    return address[0].lower(), address[1]


def loads(text: str, what: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PoolerError(f"{what}: not valid TOML ({exc})") from None


def wanted_addresses(replicas: Iterable[Backend]) -> list[Address]:
    """The replicas as sorted (host, port), each once."""
    out = sorted((b.host, b.port or DEFAULT_PORT) for b in replicas)
    seen: set[Address] = set()
    for address in out:
        if norm(address) in seen:
            raise PoolerError(f"two members have the same address {address[0]}:{address[1]}")
        seen.add(norm(address))
    return out


def render(fmt: TomlFormat, text: str, pool: str, replicas: Sequence[Backend]) -> str:
    """``text`` with the replicas of ``pool`` set to ``replicas``; every other byte kept."""
    wanted = wanted_addresses(replicas)
    data = loads(text, f"{fmt.title} config")
    current = fmt.replicas(data, pool)
    have = [norm(a) for a in current]
    if len(set(have)) != len(have):
        raise PoolerError(f"{fmt.title} pool {pool!r} lists a replica twice")
    want = {norm(a) for a in wanted}
    if set(have) == want:
        return text
    try:
        doc = tomlkit.parse(text)
    except tomlkit.exceptions.TOMLKitError as exc:
        raise PoolerError(f"{fmt.title} config: cannot be edited ({exc})") from None
    fmt.edit(doc, pool, [a for a in current if norm(a) not in want], [a for a in wanted if norm(a) not in have])
    out = _line_ends_like(text, doc.as_string())
    _verify(fmt, data, out, pool, wanted)
    return out


def _line_ends_like(original: str, out: str) -> str:
    """tomlkit writes new lines with LF; a file that is CRLF throughout stays so."""
    if "\r\n" in original and original.count("\n") == original.count("\r\n"):
        return out.replace("\r\n", "\n").replace("\n", "\r\n")
    return out


def _verify(fmt: TomlFormat, old_data: dict[str, Any], new: str, pool: str, wanted: Sequence[Address]) -> None:
    new_data = loads(new, f"rendered {fmt.title} config")
    got = fmt.replicas(new_data, pool)
    if sorted(norm(a) for a in got) != sorted(norm(a) for a in wanted):
        raise PoolerError(f"internal error: rendered {fmt.title} config has replicas {got}, wanted {list(wanted)}")
    before, after = fmt.without_replicas(old_data, pool), fmt.without_replicas(new_data, pool)
    if not (before == after or repr(before) == repr(after)):  # repr: a NaN anywhere is still "unchanged"
        raise PoolerError(f"internal error: rendering the {fmt.title} config changed more than the replica list")


class TomlFilePooler:
    """PgCat or PgDog: the pool's replica list in ``config_file``, then ``reload_command``
    (e.g. ``["kill", "-HUP", "<pid>"]``; an empty command means the pooler reloads by itself)."""

    def __init__(self, fmt: TomlFormat, config: TomlPoolerConfig, backends: Mapping[str, Backend],
                 timeout: float = 10.0) -> None:
        self.kind: str = config.kind
        self.read_back_every = READ_BACK_EVERY
        self.fmt = fmt
        self.config = config
        self.backends = dict(backends)
        self.timeout = timeout

    def render(self, text: str, members: frozenset[str]) -> str:
        unknown = sorted(members - set(self.backends))
        if unknown:
            raise PoolerError(f"no host known for member(s) {', '.join(unknown)}")
        replicas = [self.backends[name] for name in sorted(members)]
        try:
            return render(self.fmt, text, self.config.pool, replicas)
        except PoolerError as exc:
            raise PoolerError(f"{self.config.config_file}: {exc}") from None

    def _text(self) -> str:
        text = read_text(self.config.config_file)
        if text is None:
            raise PoolerError(f"{self.config.config_file} does not exist")
        return text

    def routes_for(self, members: frozenset[str], current: frozenset[str] | None) -> frozenset[str]:
        return members

    def read_pool(self) -> frozenset[str]:
        path, pool = self.config.config_file, self.config.pool
        try:
            addresses = self.fmt.replicas(loads(self._text(), f"{self.fmt.title} config"), pool)
        except PoolerError as exc:
            raise PoolerError(f"{path}: {exc}") from None
        by_address: dict[Address, list[str]] = {}
        for name, backend in self.backends.items():
            by_address.setdefault(norm((backend.host, backend.port or DEFAULT_PORT)), []).append(name)
        names, unknown = set(), []
        for host, port in addresses:
            found = by_address.get(norm((host, port)), [])
            if len(found) > 1:
                raise PoolerError(f"{path}: replica {host}:{port} is the address of several members "
                                  f"({', '.join(sorted(found))})")
            if not found:
                unknown.append(f"{host}:{port}")
            else:
                names.add(found[0])
        if unknown:
            raise PoolerError(f"{path}: pool {pool!r} has replica(s) lagwatch does not know: {', '.join(unknown)}")
        return frozenset(names)

    def apply_pool(self, members: frozenset[str]) -> None:
        path = self.config.config_file
        old = self._text()
        new = self.render(old, members)
        if new != old:
            write_text(path, new)
            try:
                run_reload(self.config.reload_command, self.timeout)
            except PoolerError as exc:
                raise restore(path, old, PoolerError(f"{path}: {exc}")) from None
        got = self.read_pool()
        if got != members:
            raise PoolerError(f"{path}: after apply the pool is {sorted(got)}, wanted {sorted(members)}")
