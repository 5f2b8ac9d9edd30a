"""The configuration's building blocks: durations, how to reach a node (and its password,
read only when needed), and the SLA a replica is held to."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Annotated

import psycopg.conninfo
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from lagwatch.durations import parse_duration
from lagwatch.errors import one_line

# WAL read a cycle, at most, per place a replica's replay stands, to date its staleness from
# commits (lag_from_wal); each read is bounded in time too (commitscan.py).
LAG_FROM_WAL_MAX_BYTES = 16 * 1024 * 1024

# What a node may be named, in the config and by Patroni alike (patroni.py): the name is a
# metric label, a log word, a line of a pooler's file ({members}) and the application_name
# a replica's walsender row is found by, which PostgreSQL cuts at 63 bytes. Letters,
# digits, '.', '_' and '-', from a letter or digit: a host name's characters and Patroni's
# own names' (postgresql0, pg-a.example.com); nothing a file, a template or a log line
# could take for structure (newlines, quotes, brackets, '=', spaces).
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
NODE_NAME_RULE = ("letters, digits, '.', '_' and '-', starting with a letter or digit, at most 63 characters "
                  "(PostgreSQL's application_name)")


SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def schema_names(schemas: tuple[str, ...]) -> tuple[str, ...]:
    """``schemas`` if each is a plain lower-case schema name lagwatch may search (not
    pg_catalog or pg_temp, which it places itself, nor ``$user``); else ValueError."""
    for schema in schemas:
        if not SCHEMA_NAME.fullmatch(schema) or schema in ("pg_catalog", "pg_temp"):
            raise ValueError("each schema is a lower-case name (letters, digits, '_'), not pg_catalog or pg_temp "
                             "(lagwatch places those itself) nor $user")
    return schemas


Schemas = Annotated[tuple[str, ...], AfterValidator(schema_names)]


def node_name_problem(name: str) -> str | None:
    """Why ``name`` is no node name (None: it is one)."""
    if name == "primary":
        return "'primary' is reserved for the primary node"
    if not NODE_NAME.fullmatch(name):
        return f"a node name is {NODE_NAME_RULE}"
    return None

Duration = Annotated[float, BeforeValidator(parse_duration)]


def shown_path(path: Path) -> str:
    """A configured path as an error message quotes it: one line, at most 100 characters."""
    return repr(one_line(str(path), 100))


def stat_of(path: Path, setting: str = "") -> os.stat_result | None:
    """What is at a configured path, None when nothing is. Where the system cannot look it
    up (a name longer than it allows, a loop of symlinks, a directory on the way it may not
    search), a ValueError that names the path (after ``setting``, where the problem's own
    place does not say it) and the reason: ``Path.exists()`` and
    ``is_dir()`` raise those rather than answer."""
    try:
        return path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        named = f"{setting} {shown_path(path)}" if setting else shown_path(path)
        raise ValueError(f"{named} cannot be looked up: {exc.strerror}") from None


def _greater_than_zero(value: float) -> float:
    if value <= 0:
        raise ValueError("must be greater than 0")
    return value


PositiveDuration = Annotated[float, BeforeValidator(parse_duration), AfterValidator(_greater_than_zero)]


class PasswordUnavailableError(Exception):
    """A password_file that could be read at load time cannot be read now."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


class NodeConfig(_Strict):
    """How to reach one PostgreSQL server. The password, if any, is never stored here."""

    dsn: str
    password_file: Path | None = None
    password_env: str | None = None

    @field_validator("dsn")
    @classmethod
    def _valid_dsn(cls, dsn: str) -> str:
        if not dsn:
            raise ValueError("must not be empty")
        try:
            params = psycopg.conninfo.conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as exc:
            # libpq quotes the part it could not parse, which may be a password (a typo such
            # as "user:secret@host/db" without "postgresql://"): only the kind of error is said.
            raise ValueError(f"not a valid libpq connection string ({_dsn_problem(str(exc))}); expected "
                             "key=value pairs (host=db user=lagwatch) or a postgresql:// URI") from None
        if "application_name" in params:
            raise ValueError("must not set application_name: lagwatch names its sessions 'lagwatch/CLUSTER/NODE'")
        # libpq only parses the string here; a bad port would surface at the first connect.
        # Neither a bad port nor a host holding '@' is shown: in a URI whose password holds
        # '@', ':' or '/' (an Azure-style user@server name too), libpq takes the password's
        # tail for the port or the host.
        encode = "percent-encode '@', ':' and '/' in a URI's user name and password (%40, %3A, %2F)"
        for port in str(params.get("port", "")).split(","):
            if port.strip().isdigit() and not 0 < int(port) < 65536:
                raise ValueError(f"port {port.strip()!r} is not a TCP port number")  # digits: no password's tail
            if port.strip() and not port.strip().isdigit():
                raise ValueError(f"a port is not a TCP port number (not shown: it may hold a password's tail; "
                                 f"{encode})")
        if "@" in str(params.get("host", "")):  # ('/' starts a socket directory: a host may hold it)
            raise ValueError(f"a host holds '@' (not shown: it may hold a password's tail; {encode})")
        return dsn

    @model_validator(mode="after")
    def _one_password_source(self) -> NodeConfig:
        _password_sources(self.password_file, self.password_env)
        return self

    def password(self) -> str | None:
        """Read the password now (so a rotated file or env is picked up on reconnect)."""
        if self.password_file is not None:
            try:
                return self.password_file.read_text().strip() or None
            except OSError as exc:
                raise PasswordUnavailableError(f"cannot read password_file {str(self.password_file)!r}: "
                                          f"{exc.strerror}") from None
        if self.password_env is not None:
            return os.environ.get(self.password_env) or None
        return None


def _password_sources(file: Path | None, env: str | None, prefix: str = "") -> None:
    if file is not None and env is not None:
        raise ValueError(f"set at most one of {prefix}password_file and {prefix}password_env")
    if file is None:
        return
    found = stat_of(file, f"{prefix}password_file")
    if found is None or not stat.S_ISREG(found.st_mode) or not os.access(file, os.R_OK):
        raise ValueError(f"{prefix}password_file {shown_path(file)} is not a readable file")


def _dsn_problem(libpq_message: str) -> str:
    """What kind of error libpq found, without any of the text it quotes."""
    for fragment, kind in (('missing "="', 'a word without "="'),
                           ("invalid connection option", "an unknown key"),
                           ("unterminated quoted string", "an unterminated quoted string"),
                           ("invalid URI query parameter", "an unknown URI query parameter"),
                           ("invalid URI", "an invalid URI"),
                           ("invalid percent-encoded token", "an invalid %-escape in the URI"),
                           ("end of string", "an incomplete URI"),
                           ("unexpected", "an unexpected character in the URI")):
        if fragment in libpq_message:
            return kind
    return "cannot be parsed"


def _positive_durations(values: dict[str, float | None]) -> None:
    bad = [k for k, v in values.items() if v is not None and v <= 0]
    if bad:
        raise ValueError(f"{', '.join(bad)} must be greater than 0")


class SlaOverride(_Strict):
    """Per-replica SLA: any key left out comes from the cluster's ``sla``."""

    max_lag: Duration | None = None
    p95: Duration | None = None
    eject_after: int | None = Field(default=None, ge=1)
    readmit_below: Duration | None = None
    readmit_after: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _positive(self) -> SlaOverride:
        _positive_durations({"max_lag": self.max_lag, "p95": self.p95, "readmit_below": self.readmit_below})
        return self


class HeartbeatConfig(_Strict):
    """An optional heartbeat: lagwatch's one write. A row of ``table`` on the primary, its
    sequence number raised every ``interval`` on lagwatch's own session; read back on each
    replica, it bounds the staleness to within about one interval under any load
    (heartbeat.py). Off unless configured; the table is the operator's to create
    (deploy/sql/lagwatch-heartbeat.sql)."""

    interval: PositiveDuration = 0.025
    table: str = "lagwatch_heartbeat"
    # This instance's row: two lagwatch instances of an HA pair beat on rows of their own.
    # Default: the host's name.
    id: str | None = None

    @field_validator("table")
    @classmethod
    def _plain_table_name(cls, value: str) -> str:
        # It goes into the statements as it is (lagwatch quotes nothing it did not check).
        if not re.fullmatch(r"([a-z_][a-z0-9_]{0,62}\.)?[a-z_][a-z0-9_]{0,62}", value):
            raise ValueError("must be a lower-case table name, optionally schema-qualified (schema.table)")
        return value

    def qualified_table(self, schemas: tuple[str, ...]) -> str:
        """The table as every statement names it, schema-qualified: an unqualified name is
        in the first of the cluster's ``schemas`` (public by default, where the SQL of
        earlier releases made it), never wherever a search path would find it first."""
        return self.table if "." in self.table else f"{schemas[0]}.{self.table}"

    @field_validator("id")
    @classmethod
    def _plain_id(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,63}", value):
            raise ValueError("must be 1 to 63 letters, digits or _ . : @ -")
        return value

    @field_validator("interval")
    @classmethod
    def _sane_interval(cls, value: float) -> float:
        if not 0.005 <= value <= 10.0:
            raise ValueError("must be between 5ms and 10s")
        return value


class SlaConfig(_Strict):
    """When a replica leaves the read pool and when it may come back (hysteresis)."""

    max_lag: Duration = 10.0  # staleness above this counts as a bad cycle
    p95: Duration | None = None  # window p95 above this ejects at once
    eject_after: int = Field(default=3, ge=1)  # consecutive bad cycles before ejecting
    readmit_below: Duration | None = None  # default: half of max_lag
    readmit_after: int = Field(default=5, ge=1)  # consecutive good cycles before readmitting
    min_replicas: int = Field(default=1, ge=0)  # the pool never shrinks below this
    fallback_to_primary: bool = False  # add the primary while fewer than min_replicas are healthy
    # Route reads to whichever node accepts writes now, always, beside the healthy replicas
    # (a promoted replica then stays in the pool, as the primary).
    primary_in_read_pool: bool = False

    @model_validator(mode="after")
    def _hysteresis(self) -> SlaConfig:
        _positive_durations({"max_lag": self.max_lag, "p95": self.p95, "readmit_below": self.readmit_below})
        if self.readmit_below is not None and self.readmit_below > self.max_lag:
            raise ValueError("readmit_below must not be above max_lag (that would flap)")
        return self

    def for_replica(self, override: SlaOverride | None) -> ReplicaSla:
        o = override or SlaOverride()
        max_lag = o.max_lag if o.max_lag is not None else self.max_lag
        readmit = o.readmit_below if o.readmit_below is not None else self.readmit_below
        return ReplicaSla(
            max_lag=max_lag,
            p95=o.p95 if o.p95 is not None else self.p95,
            eject_after=o.eject_after or self.eject_after,
            readmit_below=min(readmit, max_lag) if readmit is not None else max_lag / 2,
            readmit_after=o.readmit_after or self.readmit_after,
        )


class ReplicaSla(_Strict):
    """The SLA of one replica, every value resolved."""

    max_lag: float
    p95: float | None
    eject_after: int
    readmit_below: float
    readmit_after: int


