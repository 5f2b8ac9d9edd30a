"""PgCat and PgDog: edit the replica list of one pool in the pooler's TOML file, then reload.

Only the replica list of the configured pool is rewritten; every other byte of the file
(comments, key order, other pools, the primary's entries, whitespace, CRLF line ends) is
kept exactly. ``tomllib`` cannot report positions, so a small scanner finds the spans to
edit; ``tomllib`` then parses the result, which must hold exactly the wanted replicas and
be otherwise equal to the original, or nothing is written.

PgCat (``pgcat.toml``), pool ``app``; only shard ``"0"`` is supported, a pool with other
shards is refused (PoolerError), as one set of members cannot describe several shards::

    [pools.app.shards.0]
    servers = [
        [ "10.0.0.1", 5432, "primary" ],
        [ "10.0.0.2", 5432, "replica" ],
    ]
    database = "app"

The ``servers`` entries with role ``"replica"`` are the read pool. The array may sit on one
line, or span lines with one server per line (comments and blank lines in between are
kept; a replica's own line goes with it, trailing comment included); other layouts (two
servers on one line of a multi-line array) are refused. New replica lines go where the
first replica line was, else after the last server. The comma after the last server
follows the array's style (trailing comma or not), so the primary's line may gain or lose
that one separator comma; its entry text is never changed.

PgDog (``pgdog.toml``), pool ``app``: the ``[[databases]]`` tables with ``name = "app"``
and ``role = "replica"`` are the read pool (``role`` defaults to primary, ``port`` to
5432, ``shard`` to 0; other shards and ``role = "auto"`` are refused)::

    [[databases]]
    name = "app"
    host = "10.0.0.2"
    port = 5432
    role = "replica"
    database_name = "app_prod"

A removed replica's table disappears whole, with the comment lines directly above its
header and the blank lines after it. New tables go after the pool's last table and copy
the key lines of the pool's first replica table (``database_name``, ``user``, ``shard``...;
comments are not copied) with host/port/role set. With no replica table, the pool's first
table (the primary's) is copied instead, with ``role = "replica"``: a replica written with
only ``name``/``host``/``port``/``role`` would lose the primary's ``database_name`` and
``user`` and serve the wrong database.

Replicas are written in (host, port) order. When the replica set in the file is already
the wanted one the text is returned unchanged (whatever its order), so an unchanged pool
never causes a write or a reload. The primary as a fallback member becomes an ordinary
replica entry with the primary's host and port.
"""

from __future__ import annotations

import copy
import json
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lagwatch.config import TomlPoolerConfig
from lagwatch.poolers.base import Backend, PoolerError
from lagwatch.poolers.command import DEFAULT_PORT, read_text, restore, run_reload, write_text

Address = tuple[str, int]  # (host, port) as written in the pooler's file

# ---------------------------------------------------------------------------------------
# A scanner for the statement-level structure of a TOML document (input already parsed
# by tomllib, so it only needs to be right on valid TOML; it raises PoolerError otherwise).

_BARE_KEY = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_SCALAR_END = frozenset(" \t\r\n,]}#")

ItemKind = Literal["blank", "comment", "table", "array_table", "kv"]


@dataclass(frozen=True)
class _Item:
    """One logical line of the document: ``text[start:end]``, ending after its newline.

    For ``kv`` the key (relative to its table) and the value span; a multi-line value makes
    one item of several lines. For headers the key path and ``value_end`` after ``]``/``]]``.
    """

    kind: ItemKind
    start: int
    end: int
    path: tuple[str, ...] = ()
    value_start: int = 0
    value_end: int = 0


@dataclass(frozen=True)
class _Element:
    """One value of an array: ``text[start:end]``, and the index of its comma if any."""

    start: int
    end: int
    comma: int | None


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.n = len(text)

    def error(self, pos: int, message: str) -> PoolerError:
        line = self.text.count("\n", 0, pos) + 1
        return PoolerError(f"line {line}: {message}")

    def ws(self, pos: int) -> int:
        while pos < self.n and self.text[pos] in " \t":
            pos += 1
        return pos

    def newline(self, pos: int) -> int | None:
        """The position after a newline at ``pos``, or None if there is none there."""
        if self.text.startswith("\n", pos):
            return pos + 1
        if self.text.startswith("\r\n", pos):
            return pos + 2
        return None

    def comment(self, pos: int) -> int:
        """Skip a comment at ``pos`` up to (not including) its line end."""
        if pos < self.n and self.text[pos] == "#":
            end = self.text.find("\n", pos)
            end = self.n if end < 0 else end
            if end > pos and self.text[end - 1] == "\r":
                end -= 1
            return end
        return pos

    def line_end(self, pos: int) -> int:
        """Skip spaces and a comment to the end of the line; the position after the newline."""
        pos = self.comment(self.ws(pos))
        if pos >= self.n:
            return self.n
        after = self.newline(pos)
        if after is None:
            raise self.error(pos, "expected the end of the line")
        return after

    def blanks(self, pos: int) -> int:
        """Skip spaces, newlines and comments (inside arrays)."""
        while True:
            pos = self.comment(self.ws(pos))
            after = self.newline(pos)
            if after is None:
                return pos
            pos = after

    def string(self, pos: int) -> int:
        text = self.text
        for delim in ('"""', "'''"):
            if text.startswith(delim, pos):
                q = pos + 3
                while q < self.n:
                    if delim == '"""' and text[q] == "\\":
                        q += 2
                    elif text.startswith(delim, q):
                        end = q + 3
                        while end < self.n and end < q + 5 and text[end] == delim[0]:
                            end += 1  # up to two quotes may sit right before the delimiter
                        return end
                    else:
                        q += 1
                raise self.error(pos, "unterminated multi-line string")
        quote = text[pos]
        q = pos + 1
        while q < self.n and text[q] not in "\r\n":
            if quote == '"' and text[q] == "\\":
                q += 2
            elif text[q] == quote:
                return q + 1
            else:
                q += 1
        raise self.error(pos, "unterminated string")

    def simple_key(self, pos: int) -> tuple[str, int]:
        if pos < self.n and self.text[pos] in "\"'":
            end = self.string(pos)
            try:
                value = tomllib.loads("k = " + self.text[pos:end])["k"]
            except tomllib.TOMLDecodeError:
                raise self.error(pos, "bad quoted key") from None
            return str(value), end
        end = pos
        while end < self.n and self.text[end] in _BARE_KEY:
            end += 1
        if end == pos:
            raise self.error(pos, "expected a key")
        return self.text[pos:end], end

    def key(self, pos: int) -> tuple[tuple[str, ...], int]:
        """A dotted key; returns its parts and the position after it (and its spaces)."""
        parts = []
        while True:
            part, pos = self.simple_key(self.ws(pos))
            parts.append(part)
            pos = self.ws(pos)
            if pos < self.n and self.text[pos] == ".":
                pos += 1
                continue
            return tuple(parts), pos

    def value(self, pos: int) -> int:
        if pos >= self.n:
            raise self.error(pos, "expected a value")
        char = self.text[pos]
        if char in "\"'":
            return self.string(pos)
        if char == "[":
            return self.array(pos)[1] + 1
        if char == "{":
            return self.inline_table(pos)
        end = pos
        while True:
            while end < self.n and self.text[end] not in _SCALAR_END:
                end += 1
            # A date-time may use a space between date and time: 1979-05-27 07:32:00Z
            word = self.text[pos:end]
            if (len(word) == 10 and word[4] == "-" and word[7] == "-" and self.text.startswith(" ", end)
                    and end + 1 < self.n and self.text[end + 1].isdigit()):
                end += 1
                continue
            break
        if end == pos:
            raise self.error(pos, "expected a value")
        return end

    def array(self, pos: int) -> tuple[list[_Element], int]:
        """The elements of the array at ``pos`` (``[``) and the index of its ``]``."""
        elements: list[_Element] = []
        pos += 1
        while True:
            pos = self.blanks(pos)
            if pos >= self.n:
                raise self.error(pos, "unterminated array")
            if self.text[pos] == "]":
                return elements, pos
            start = pos
            end = self.value(pos)
            pos = self.blanks(end)
            if pos < self.n and self.text[pos] == ",":
                elements.append(_Element(start, end, pos))
                pos += 1
                continue
            elements.append(_Element(start, end, None))
            if pos >= self.n or self.text[pos] != "]":
                raise self.error(pos, "expected , or ] in array")
            return elements, pos

    def inline_table(self, pos: int) -> int:
        pos = self.blanks(pos + 1)
        if self.text.startswith("}", pos):
            return pos + 1
        while True:
            _, pos = self.key(pos)
            if not self.text.startswith("=", pos):
                raise self.error(pos, "expected = in inline table")
            pos = self.blanks(self.value(self.ws(pos + 1)))
            if self.text.startswith(",", pos):
                pos = self.blanks(pos + 1)
                continue
            if self.text.startswith("}", pos):
                return pos + 1
            raise self.error(pos, "expected , or } in inline table")

    def items(self) -> list[_Item]:
        """The whole document as consecutive logical lines (their texts concatenate to it)."""
        out: list[_Item] = []
        pos = 0
        while pos < self.n:
            start = pos
            q = self.ws(pos)
            after = self.newline(q)
            if q >= self.n:
                out.append(_Item("blank", start, self.n))
                break
            if after is not None:
                out.append(_Item("blank", start, after))
                pos = after
                continue
            char = self.text[q]
            if char == "#":
                pos = self.line_end(q)
                out.append(_Item("comment", start, pos))
            elif char == "[":
                is_array = self.text.startswith("[[", q)
                path, q = self.key(q + (2 if is_array else 1))
                close = "]]" if is_array else "]"
                if not self.text.startswith(close, q):
                    raise self.error(q, f"expected {close}")
                q += len(close)
                pos = self.line_end(q)
                out.append(_Item("array_table" if is_array else "table", start, pos, path, value_end=q))
            else:
                path, q = self.key(q)
                if not self.text.startswith("=", q):
                    raise self.error(q, "expected =")
                value_start = self.ws(q + 1)
                value_end = self.value(value_start)
                pos = self.line_end(value_end)
                out.append(_Item("kv", start, pos, path, value_start, value_end))
        return out


def _with_tables(items: Sequence[_Item]) -> list[tuple[_Item, tuple[str, ...]]]:
    """Each item with the full key path of its key/value (table path + key), or its header path."""
    table: tuple[str, ...] = ()
    out = []
    for item in items:
        if item.kind in ("table", "array_table"):
            table = item.path
            out.append((item, item.path))
        elif item.kind == "kv":
            out.append((item, table + item.path))
        else:
            out.append((item, ()))
    return out


# ---------------------------------------------------------------------------------------
# Reading the replicas from parsed TOML.


def _loads(text: str, what: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PoolerError(f"{what}: not valid TOML ({exc})") from None


def _norm(address: Address) -> Address:
    return address[0].lower(), address[1]


def _pgcat_servers(data: Mapping[str, Any], pool: str) -> list[tuple[str, int, str]]:
    """The ``servers`` of shard 0 of ``pool``, checked: [(host, port, role)]."""
    pools = data.get("pools")
    if not isinstance(pools, dict) or not isinstance(pools.get(pool), dict):
        raise PoolerError(f"PgCat config has no [pools.{pool}]")
    shards = pools[pool].get("shards")
    if not isinstance(shards, dict) or not isinstance(shards.get("0"), dict):
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
        out.append((entry[0], entry[1], entry[2]))
    return out


def _pgdog_tables(data: Mapping[str, Any], pool: str) -> list[tuple[int, Address, str]]:
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


def replica_addresses(kind: str, text: str, pool: str) -> list[Address]:
    """The replicas (host, port) of ``pool`` in a PgCat or PgDog config text, in file order."""
    data = _loads(text, f"{kind} config")
    if kind == "pgcat":
        return [(host, port) for host, port, role in _pgcat_servers(data, pool) if role == "replica"]
    if kind == "pgdog":
        return [address for _, address, role in _pgdog_tables(data, pool) if role == "replica"]
    raise PoolerError(f"unknown TOML pooler kind {kind!r}")


def _wanted(replicas: Iterable[Backend]) -> list[Address]:
    """The replicas as sorted (host, port), each once."""
    out = sorted((b.host, b.port or DEFAULT_PORT) for b in replicas)
    seen: set[Address] = set()
    for address in out:
        if _norm(address) in seen:
            raise PoolerError(f"two members have the same address {address[0]}:{address[1]}")
        seen.add(_norm(address))
    return out


def _same_set(current: Sequence[Address], wanted: Sequence[Address]) -> bool:
    normalized = [_norm(a) for a in current]
    return len(set(normalized)) == len(normalized) and set(normalized) == {_norm(a) for a in wanted}


def _equal(a: Any, b: Any) -> bool:
    return bool(a == b) or repr(a) == repr(b)  # repr: a NaN anywhere is still "unchanged"


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def _eol(text: str, near: int = 0) -> str:
    newline = text.find("\n", near)
    if newline < 0:
        newline = text.find("\n")
    return "\r\n" if newline > 0 and text[newline - 1] == "\r" else "\n"


# ---------------------------------------------------------------------------------------
# PgCat


def render_pgcat(text: str, pool: str, replicas: Sequence[Backend]) -> str:
    """``text`` (a pgcat.toml) with the replica servers of ``pool`` shard 0 set to ``replicas``."""
    wanted = _wanted(replicas)
    servers = _pgcat_servers(_loads(text, "PgCat config"), pool)
    roles = [role for _, _, role in servers]
    if _same_set([(h, p) for h, p, role in servers if role == "replica"], wanted):
        return text
    scanner = _Scanner(text)
    target = ("pools", pool, "shards", "0", "servers")
    found = [item for item, path in _with_tables(scanner.items()) if item.kind == "kv" and path == target]
    if len(found) != 1 or text[found[0].value_start] != "[":
        raise PoolerError(f"PgCat pool {pool!r}: cannot locate `servers = [...]` under [pools.{pool}.shards.0] "
                          "(inline-table forms are not supported)")
    open_at = found[0].value_start
    elements, close = scanner.array(open_at)
    if len(elements) != len(servers):
        raise PoolerError(f"PgCat pool {pool!r}: could not read the servers array")
    replica_idx = [i for i, role in enumerate(roles) if role == "replica"]
    style = elements[replica_idx[0]] if replica_idx else (elements[0] if elements else None)
    padded = style is None or text[style.start + 1] in " \t\r\n"
    new = [(f'[ {_toml_string(h)}, {p}, "replica" ]' if padded else f'[{_toml_string(h)}, {p}, "replica"]')
           for h, p in wanted]
    if "\n" in text[open_at:close]:
        array = _pgcat_multiline(text, scanner, open_at, close, elements, replica_idx, new, pool)
    else:
        array = _pgcat_single_line(text, open_at, close, elements, replica_idx, new)
    out = text[:open_at] + array + text[close + 1:]
    _verify_pgcat(text, out, pool, wanted)
    return out


def _pgcat_single_line(text: str, open_at: int, close: int, elements: Sequence[_Element],
                       replica_idx: Sequence[int], new: Sequence[str]) -> str:
    """The array rewritten on one line: kept entries verbatim, the new ones where the
    first replica was (else at the end), the original spacing and trailing comma kept."""
    texts: list[str] = []
    first = replica_idx[0] if replica_idx else len(elements)
    for i, element in enumerate(elements):
        if i == first:
            texts += new
        if i not in replica_idx:
            texts.append(text[element.start:element.end])
    if first == len(elements):
        texts += new
    if not elements:
        return "[" + ", ".join(texts) + "]"
    last = elements[-1]
    lead = text[open_at + 1:elements[0].start]
    trail = text[(last.comma + 1 if last.comma is not None else last.end):close]
    sep = text[elements[0].end:elements[1].start] if len(elements) > 1 else ", "
    trailing_comma = "," if last.comma is not None and texts else ""
    return "[" + lead + sep.join(texts) + trailing_comma + trail + "]"


@dataclass
class _Line:
    """One line of a multi-line servers array: a server entry, or any other line (kept as is)."""

    text: str = ""  # a non-entry line, verbatim with its newline
    is_entry: bool = False
    replica: bool = False
    indent: str = ""
    entry: str = ""  # the server entry, verbatim
    before_comma: str = ""  # spaces between the entry and its comma
    comma: bool = False
    rest: str = ""  # after the comma: spaces and a comment
    eol: str = ""  # "" on the last entry when ``]`` follows it on the same line

    def render(self) -> str:
        if not self.is_entry:
            return self.text
        comma = self.before_comma + "," if self.comma else ""
        return self.indent + self.entry + comma + self.rest + self.eol


def _split_lines(text: str) -> list[str]:
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + [parts[-1]]


def _pgcat_multiline(text: str, scanner: _Scanner, open_at: int, close: int, elements: Sequence[_Element],
                     replica_idx: Sequence[int], new: Sequence[str], pool: str) -> str:
    """The array with the replica lines removed and the new ones written one per line
    where the first replica was (else after the last entry). Other lines are kept as they
    are; only the commas between entries follow the array's trailing-comma style."""
    eol = _eol(text, open_at)
    unsupported = PoolerError(f"PgCat pool {pool!r}: servers array layout not supported; "
                              "put it on one line or one server per line")
    head_end = text.index("\n", open_at) + 1  # the "[" line, with its comment if any
    lines: list[_Line] = []
    pos = head_end
    for i, element in enumerate(elements):
        start = text.rfind("\n", 0, element.start) + 1
        if start < head_end or text[start:element.start].strip(" \t"):
            raise unsupported
        lines += [_Line(text=chunk) for chunk in _split_lines(text[pos:start])[:-1]]
        line = _Line(is_entry=True, replica=i in replica_idx, indent=text[start:element.start],
                     entry=text[element.start:element.end])
        q = element.end
        if element.comma is not None:
            if scanner.ws(q) != element.comma:
                raise unsupported
            line.before_comma, line.comma = text[element.end:element.comma], True
            q = element.comma + 1
        rest_end = scanner.comment(scanner.ws(q))
        after = scanner.newline(rest_end)
        if after is None:  # "]" right after the last entry
            if not (rest_end == close and i == len(elements) - 1):
                raise unsupported
            pos = q
        else:
            line.rest, line.eol = text[q:rest_end], text[rest_end:after]
            pos = after
        lines.append(line)
    *others, closing = _split_lines(text[pos:close + 1])
    lines += [_Line(text=chunk) for chunk in others]
    closes_inline = bool(lines) and lines[-1].is_entry and lines[-1].eol == ""

    entries = [line for line in lines if line.is_entry]
    trailing = entries[-1].comma if entries else True
    replicas = [n for n, line in enumerate(lines) if line.replica]
    kept = [line for line in lines if not line.replica]
    if replicas:
        at = sum(1 for line in lines[:replicas[0]] if not line.replica)
        indent = lines[replicas[0]].indent
    elif entries:
        at = max(n for n, line in enumerate(kept) if line.is_entry) + 1
        indent = entries[-1].indent
    else:
        at, indent = 0, "    "
    out = kept[:at] + [_Line(is_entry=True, indent=indent, entry=e, eol=eol) for e in new] + kept[at:]
    out_entries = [line for line in out if line.is_entry]
    for n, line in enumerate(out_entries):
        line.comma = n < len(out_entries) - 1 or trailing
        if closes_inline and line.eol == "":
            line.eol = eol
    if closes_inline:
        if out and out[-1].is_entry:
            out[-1].eol = ""
        else:
            closing = closing.lstrip(" \t")
    return text[open_at:head_end] + "".join(line.render() for line in out) + closing


def _verify_pgcat(old: str, new: str, pool: str, wanted: Sequence[Address]) -> None:
    old_data, new_data = _loads(old, "PgCat config"), _loads(new, "rendered PgCat config")
    got = [(h, p) for h, p, role in _pgcat_servers(new_data, pool) if role == "replica"]
    if sorted(_norm(a) for a in got) != sorted(_norm(a) for a in wanted):
        raise PoolerError(f"internal error: rendered PgCat config has replicas {got}, wanted {list(wanted)}")

    def without_replicas(data: dict[str, Any]) -> dict[str, Any]:
        data = copy.deepcopy(data)
        shard = data["pools"][pool]["shards"]["0"]
        shard["servers"] = [s for s in shard["servers"] if s[2] != "replica"]
        return data

    if not _equal(without_replicas(old_data), without_replicas(new_data)):
        raise PoolerError("internal error: rendering the PgCat config changed more than the replica list")


# ---------------------------------------------------------------------------------------
# PgDog


def render_pgdog(text: str, pool: str, replicas: Sequence[Backend]) -> str:
    """``text`` (a pgdog.toml) with the ``role = "replica"`` tables of ``pool`` set to ``replicas``."""
    wanted = _wanted(replicas)
    data = _loads(text, "PgDog config")
    tables = _pgdog_tables(data, pool)
    if _same_set([address for _, address, role in tables if role == "replica"], wanted):
        return text
    items = _Scanner(text).items()
    headers = [i for i, item in enumerate(items) if item.kind in ("table", "array_table")]
    databases = [i for i in headers if items[i].kind == "array_table" and items[i].path == ("databases",)]
    if (any(items[i].path[0] == "databases" for i in headers if i not in databases)
            or len(databases) != len(data.get("databases", []))):
        raise PoolerError("PgDog config: only [[databases]] tables (no inline or sub-table forms) are supported")
    units = _units(items, headers)
    pool_headers = [databases[index] for index, _, _ in tables]
    replica_headers = [databases[index] for index, _, role in tables if role == "replica"]
    removed = {i for h in replica_headers for i in range(*units[h][0::2])}
    insert_at = units[pool_headers[-1]][2]
    eol = _eol(text)
    template = _pgdog_template(text, items, units[replica_headers[0] if replica_headers else pool_headers[0]])
    new_tables = [template(host, port, eol) for host, port in wanted]
    out: list[str] = []
    for i in range(len(items) + 1):
        if i == insert_at:
            out.append(_pgdog_block("".join(out), new_tables, items[i] if i < len(items) else None, eol))
        if i < len(items) and i not in removed:
            out.append(text[items[i].start:items[i].end])
    rendered = "".join(out)
    _verify_pgdog(data, rendered, pool, wanted)
    return rendered


def _units(items: Sequence[_Item], headers: Sequence[int]) -> dict[int, tuple[int, int, int]]:
    """For each header index: (first item, last key/value item + 1, end) of its table.

    A table starts with the comment lines right above its header (no blank line between),
    its body ends with its last key/value and the comment lines right after it, and it
    ends after the blank lines that follow; later comments separated by a blank line, and
    the comments right above the next header, belong to no table / the next one.
    """
    leads = []
    for n, h in enumerate(headers):
        floor = headers[n - 1] if n else -1
        lead = h
        while lead - 1 > floor and items[lead - 1].kind == "comment":
            lead -= 1
        leads.append(lead)
    out = {}
    for n, h in enumerate(headers):
        limit = leads[n + 1] if n + 1 < len(headers) else len(items)
        body = max([i for i in range(h + 1, limit) if items[i].kind == "kv"], default=h) + 1
        while body < limit and items[body].kind == "comment":
            body += 1
        end = body
        while end < limit and items[end].kind == "blank":
            end += 1
        out[h] = (leads[n], body, end)
    return out


class _Template:
    """Builds a new ``[[databases]]`` table text (no final newline) for (host, port)."""

    def __init__(self, header: str, lines: Sequence[tuple[str, str]]) -> None:
        self.header = header
        self.lines = lines  # (key, text) in order; the host and port lines are format strings

    def __call__(self, host: str, port: int, eol: str) -> str:
        out = [self.header]
        for key, line in self.lines:
            out.append(line.format(host=_toml_string(host), port=port) if key in ("host", "port") else line)
        return eol.join(out)


def _pgdog_template(text: str, items: Sequence[_Item], unit: tuple[int, int, int]) -> _Template:
    """New replica tables copy the key lines of the table ``unit`` (without its comments),
    with host, port and ``role = "replica"`` set; missing port/role lines are added."""
    first, body, _ = unit
    header = next(i for i in range(first, body) if items[i].kind == "array_table")
    lines: list[tuple[str, str]] = []
    for item in items[header + 1:body]:
        if item.kind != "kv":
            continue
        key = ".".join(item.path)
        prefix = text[item.start:item.value_start]
        if key in ("host", "port"):
            lines.append((key, prefix.replace("{", "{{").replace("}", "}}") + "{" + key + "}"))
        elif key == "role":
            lines.append((key, prefix + '"replica"'))
        else:
            lines.append((key, text[item.start:item.value_end]))
    for key, after in (("port", "host"), ("role", "port")):
        if not any(k == key for k, _ in lines):
            at = next((n + 1 for n, (k, _) in enumerate(lines) if k == after), len(lines))
            lines.insert(at, (key, "port = {port}" if key == "port" else 'role = "replica"'))
    return _Template(text[items[header].start:items[header].value_end], lines)


def _pgdog_block(before: str, tables: Sequence[str], following: _Item | None, eol: str) -> str:
    """The new tables, each preceded by a blank line, and a blank line before what follows."""
    if not tables:
        return ""
    block = ""
    for table in tables:
        so_far = before + block
        if so_far and not so_far.endswith("\n"):
            block += eol
        if so_far and not (so_far + block).endswith(("\n\n", "\n\r\n")):
            block += eol
        block += table + eol
    if following is not None and following.kind != "blank":
        block += eol
    return block


def _verify_pgdog(old_data: dict[str, Any], new: str, pool: str, wanted: Sequence[Address]) -> None:
    new_data = _loads(new, "rendered PgDog config")
    got = [address for _, address, role in _pgdog_tables(new_data, pool) if role == "replica"]
    if sorted(_norm(a) for a in got) != sorted(_norm(a) for a in wanted):
        raise PoolerError(f"internal error: rendered PgDog config has replicas {got}, wanted {list(wanted)}")

    def without_replicas(data: dict[str, Any]) -> dict[str, Any]:
        data = dict(data)
        data["databases"] = [d for d in data.get("databases", [])
                             if not (d.get("name") == pool and d.get("role") == "replica")]
        return data

    if not _equal(without_replicas(old_data), without_replicas(new_data)):
        raise PoolerError("internal error: rendering the PgDog config changed more than the replica list")


# ---------------------------------------------------------------------------------------
# The adapter


class TomlPooler:
    """PgCat or PgDog: the pool's replica list in ``config_file``, then ``reload_command``
    (e.g. ``["kill", "-HUP", "<pid>"]``; an empty command means the pooler reloads by itself)."""

    def __init__(self, config: TomlPoolerConfig, backends: Mapping[str, Backend], timeout: float = 10.0) -> None:
        self.kind: str = config.kind
        self.config = config
        self.backends = dict(backends)
        self.timeout = timeout

    def render(self, text: str, members: frozenset[str]) -> str:
        unknown = sorted(members - set(self.backends))
        if unknown:
            raise PoolerError(f"no host known for member(s) {', '.join(unknown)}")
        replicas = [self.backends[name] for name in sorted(members)]
        renderer = render_pgcat if self.config.kind == "pgcat" else render_pgdog
        try:
            return renderer(text, self.config.pool, replicas)
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
        path = self.config.config_file
        text = self._text()
        try:
            addresses = replica_addresses(self.config.kind, text, self.config.pool)
        except PoolerError as exc:
            raise PoolerError(f"{path}: {exc}") from None
        by_address: dict[Address, list[str]] = {}
        for name, backend in self.backends.items():
            by_address.setdefault(_norm((backend.host, backend.port or DEFAULT_PORT)), []).append(name)
        names, unknown = set(), []
        for host, port in addresses:
            found = by_address.get(_norm((host, port)), [])
            if len(found) > 1:
                raise PoolerError(f"{path}: replica {host}:{port} is the address of several members "
                                  f"({', '.join(sorted(found))})")
            if not found:
                unknown.append(f"{host}:{port}")
            else:
                names.add(found[0])
        if unknown:
            raise PoolerError(f"{path}: pool {self.config.pool!r} has replica(s) lagwatch does not know: "
                              f"{', '.join(unknown)}")
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
