"""The pooler sections of the configuration, one schema per ``pooler.kind`` (the adapters
that use them are in lagwatch.poolers)."""

from __future__ import annotations

import re
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from lagwatch.config.base import NodeConfig, _password_sources, _Strict
from lagwatch.escape import excerpt

PGBOUNCER_NAME = re.compile(r"[A-Za-z0-9_.$-]+")
PGBOUNCER_PAIR = re.compile(r"\s*([A-Za-z_]+)\s*=\s*('(?:[^'\\]|\\.|'')*'|[^\s']+)")
# The keys of a PgBouncer [databases] entry (PgBouncer 1.18's docs) but host, which lagwatch writes.
PGBOUNCER_DB_KEYS = frozenset({"dbname", "port", "user", "password", "auth_user", "auth_dbname", "pool_size",
                               "min_pool_size", "reserve_pool", "connect_query", "pool_mode", "max_db_connections",
                               "client_encoding", "datestyle", "timezone", "application_name"})
# A host lagwatch may write into a pooler's config: a name, an IPv4 or IPv6 address (with
# a zone), or a Unix socket directory. Nothing that could end a value or a line.
POOLED_HOST = re.compile(r"[A-Za-z0-9._:%-]+|/[A-Za-z0-9._/-]+")


class PgBouncerPoolerConfig(_Strict):
    kind: Literal["pgbouncer"]
    admin_dsn: str
    admin_password_file: Path | None = None
    admin_password_env: str | None = None
    include_file: Path  # lagwatch owns this file: one [databases] entry
    database: str  # the read database's name in PgBouncer
    options: str = ""  # the rest of the entry after host=..., e.g. "port=5432 dbname=app"
    # With no eligible replica: point the entry at the primary, or leave it as it is.
    when_empty: Literal["primary", "keep"] = "primary"

    @field_validator("admin_dsn")
    @classmethod
    def _valid_admin_dsn(cls, dsn: str) -> str:
        return NodeConfig._valid_dsn(dsn)

    @model_validator(mode="after")
    def _one_admin_password_source(self) -> PgBouncerPoolerConfig:
        _password_sources(self.admin_password_file, self.admin_password_env, "admin_")
        return self

    @field_validator("database")
    @classmethod
    def _database_name(cls, value: str) -> str:
        # Written as the key of a [databases] line: anything else could start a new setting.
        if not PGBOUNCER_NAME.fullmatch(value):
            raise ValueError(f"'{excerpt(value)}' is not a PgBouncer database name lagwatch writes "
                             "(letters, digits and _ . - $ only)")
        return value

    @field_validator("options")
    @classmethod
    def _entry_options(cls, value: str) -> str:
        # Written after host=... on the entry's line: key=value pairs PgBouncer knows, one line.
        if not value:
            return value
        if any(not ch.isprintable() for ch in value) or ";" in value or "#" in value:
            raise ValueError("must be one line of key=value pairs, without control characters, ';' or '#'")
        pairs = PGBOUNCER_PAIR.findall(value)
        if PGBOUNCER_PAIR.sub("", value).strip():
            raise ValueError("not key=value pairs (e.g. \"port=5432 dbname=app\")")
        unknown = sorted({key for key, _ in pairs} - PGBOUNCER_DB_KEYS)
        if unknown:
            raise ValueError(f"PgBouncer database entries do not take {', '.join(unknown)}"
                             + (" (lagwatch writes host= itself)" if "host" in unknown else ""))
        return value


# What HAProxy accepts as a backend or server name (and what the runtime API can address).
HAPROXY_NAME = re.compile(r"[A-Za-z0-9._:-]+")


class HAProxyPoolerConfig(_Strict):
    kind: Literal["haproxy"]
    socket: Path  # the stats socket with "level admin"
    backend: str
    servers: dict[str, str]  # lagwatch member name (replica name or "primary") -> HAProxy server
    ejected_state: Literal["maint", "drain"] = "maint"

    @field_validator("backend")
    @classmethod
    def _backend_name(cls, name: str) -> str:
        if not HAPROXY_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not an HAProxy name (letters, digits and . _ : - only)")
        return name

    @field_validator("servers")
    @classmethod
    def _server_names(cls, servers: dict[str, str]) -> dict[str, str]:
        bad = sorted(server for server in servers.values() if not HAPROXY_NAME.fullmatch(server))
        if bad:
            raise ValueError(f"not HAProxy server names (letters, digits and . _ : - only): "
                             f"{', '.join(map(repr, bad))}")
        by_server: dict[str, str] = {}
        for member, server in sorted(servers.items()):
            if server in by_server:
                raise ValueError(f"{by_server[server]!r} and {member!r} both map to server {server!r}")
            by_server[server] = member
        return servers


class TomlPoolerConfig(_Strict):
    kind: Literal["pgcat", "pgdog"]
    config_file: Path
    pool: str  # PgCat: the [pools.NAME] section; PgDog: the [[databases]] name
    reload_command: tuple[str, ...]  # argv, run after the file is replaced


class CommandPoolerConfig(_Strict):
    # A template's whitespace (its final newline) is part of the output.
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False)

    kind: Literal["command"]
    template: str  # Python str.format template; {members}, {hosts} and {backends} are filled in
    output_file: Path
    reload_command: tuple[str, ...]

    @field_validator("template")
    @classmethod
    def _fills_in(cls, template: str) -> str:
        check_template(template)
        return template


TEMPLATE_FIELDS = ("members", "hosts", "backends")


def check_template(template: str) -> None:
    """Raise ValueError unless ``template`` uses exactly the fields the command pooler
    fills in, plainly ({members}, not {members.x} or {0}), and formats with sample values
    as run would format it."""
    known = "only {members}, {hosts} and {backends} exist (write {{ and }} for braces)"
    try:
        fields = list(_template_fields(template))
    except ValueError as exc:
        raise ValueError(f"not a valid format string: {exc}") from None
    for field in fields:
        if field == "" or field.isdigit():
            raise ValueError(f"positional placeholder {{{field}}}: {known}")
        if field not in TEMPLATE_FIELDS:
            raise ValueError(f"unknown placeholder {{{field}}}: {known}")
    try:
        template.format(**{name: "x" for name in TEMPLATE_FIELDS})
    except (ValueError, KeyError, IndexError, AttributeError, TypeError) as exc:
        raise ValueError(f"not a valid format string: {exc}") from None


def _template_fields(template: str) -> Iterator[str]:
    for _, field, spec, _ in string.Formatter().parse(template):
        if field is not None:
            yield field
        if spec:
            yield from _template_fields(spec)


POOLER_KINDS = ("pgbouncer", "haproxy", "pgcat", "pgdog", "command")
PoolerConfig = Annotated[
    PgBouncerPoolerConfig | HAProxyPoolerConfig | TomlPoolerConfig | CommandPoolerConfig,
    Field(discriminator="kind"),
]


