"""The configuration: one YAML file, validated once, then a frozen typed object.

Every problem is reported at once, each with the path of the key it concerns
(``clusters[0].replicas[1].dsn: ...``). Nothing here ever echoes a password.
"""

from __future__ import annotations

import os
import re
import string
import urllib.parse
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

import psycopg.conninfo
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from lagwatch.durations import parse_duration
from lagwatch.errors import ConfigError, validation_problems
from lagwatch.shard import shard_of
from lagwatch.webconfig import WebConfig, load_web_config
from lagwatch.yamlfile import load_yaml

Duration = Annotated[float, BeforeValidator(parse_duration)]


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
        for port in str(params.get("port", "")).split(","):
            if port.strip() and not (port.strip().isdigit() and 0 < int(port) < 65536):
                raise ValueError(f"port {port.strip()!r} is not a TCP port number")
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
    if file is not None and not (file.is_file() and os.access(file, os.R_OK)):
        raise ValueError(f"{prefix}password_file {str(file)!r} is not a readable file")


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
            raise ValueError(f"{value!r} is not a PgBouncer database name lagwatch writes "
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


class ReplicaConfig(NodeConfig):
    name: str = Field(min_length=1)
    # The replica's row in the primary's pg_stat_replication is found by this name.
    application_name: str | None = None
    sla: SlaOverride | None = None
    read_pool: bool = True  # false: measured, never routed to (Patroni's noloadbalance tag)

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name == "primary":
            raise ValueError("'primary' is reserved for the primary node")
        return name

    @property
    def walsender_name(self) -> str:
        return self.application_name or self.name


class ClusterConfig(_Strict):
    name: str = Field(min_length=1)
    primary: NodeConfig
    replicas: tuple[ReplicaConfig, ...] = ()
    # pg_walinspect FPI statistics: "auto" uses them where installed and permitted.
    walinspect: Literal["auto", "off"] = "auto"
    walinspect_max_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    sla: SlaConfig = SlaConfig()
    pooler: PoolerConfig | None = None
    dry_run: bool = False  # decide, log and count pool changes, but change nothing
    # A secret from which the leader lock's key is derived, so that no other login can take
    # the lock first; every instance of an HA pair needs the same value.
    leader_lock_key: str | None = Field(default=None, min_length=8)
    # A standby cluster (a Patroni standby cluster, a DR site): the primary DSN reaches its
    # standby leader, which replicates from outside the cluster; its replicas' staleness is
    # measured against what the standby leader has received. Set by discovery from Patroni.
    standby_cluster: bool = False

    @property
    def primary_may_be_pooled(self) -> bool:
        """Whether the pooler may be told to route reads to the primary: the fallback, a
        'primary' HAProxy server, or PgBouncer pointing an emptied entry at the primary."""
        if self.sla.fallback_to_primary or self.sla.primary_in_read_pool:
            return True
        if isinstance(self.pooler, HAProxyPoolerConfig):
            return "primary" in self.pooler.servers
        if isinstance(self.pooler, PgBouncerPoolerConfig):
            return self.pooler.when_empty == "primary" and self.sla.min_replicas == 0
        return False

    def replica_sla(self, name: str) -> ReplicaSla:
        return self.replica_slas[name]

    @cached_property
    def replica_slas(self) -> dict[str, ReplicaSla]:
        """Every replica's SLA, resolved once per config (each cycle reads them all)."""
        return {r.name: self.sla.for_replica(r.sla) for r in self.replicas}

    @model_validator(mode="after")
    def _pooled_nodes_have_one_address(self, info: ValidationInfo) -> ClusterConfig:
        """A pooler routes to one host and port per node: a multi-host DSN cannot be one.
        The primary's DSN may find the writer among several hosts unless the pool may route
        to it (fallback_to_primary, or a 'primary' HAProxy server). A discovered cluster's
        writer DSN lists every member: its fallback routes to the leader member instead."""
        if self.pooler is None:
            return self
        discovered = bool((info.context or {}).get(DISCOVERED))
        nodes: list[tuple[str, NodeConfig]] = [("primary", self.primary)] \
            if self.primary_may_be_pooled and not discovered else []
        nodes += [(f"replicas[{i}]", r) for i, r in enumerate(self.replicas)]
        for where, node in nodes:
            params = psycopg.conninfo.conninfo_to_dict(node.dsn)
            for key in ("host", "hostaddr", "port"):
                if "," in str(params.get(key) or ""):
                    raise ValueError(f"{where}.dsn: with a pooler each node the pool may route to needs "
                                     f"one {key}, got {str(params[key])!r}")
            for key in ("host", "hostaddr"):
                value = str(params.get(key) or "")
                if value and not POOLED_HOST.fullmatch(value):
                    # It is written into the pooler's config: a newline or quote could add lines.
                    raise ValueError(f"{where}.dsn: {key} {value!r} cannot be written into a pooler config "
                                     "(a host name, an IP address or a socket directory expected)")
        return self

    @model_validator(mode="after")
    def _pooler_members(self, info: ValidationInfo) -> ClusterConfig:
        if isinstance(self.pooler, HAProxyPoolerConfig):
            known = {r.name for r in self.replicas} | {"primary"}
            unknown = sorted(set(self.pooler.servers) - known)
            # Discovered members come and go: a server mapped to one not there now is kept
            # out of rotation (the adapter ejects every mapped server it is not told to route to).
            if unknown and not (info.context or {}).get(DISCOVERED):
                raise ValueError(f"pooler.servers names unknown replicas: {', '.join(unknown)}")
            for key in ("fallback_to_primary", "primary_in_read_pool"):
                if getattr(self.sla, key) and "primary" not in self.pooler.servers \
                        and not (info.context or {}).get(DISCOVERED):
                    raise ValueError(f"sla.{key} needs a 'primary' entry in pooler.servers: "
                                     "HAProxy can only route reads to a server of its backend")
        return self

    @model_validator(mode="after")
    def _unique_replicas(self) -> ClusterConfig:
        seen: set[str] = set()
        for replica in self.replicas:
            for key in {replica.name, replica.walsender_name}:
                if key in seen:
                    raise ValueError(f"replica name or application_name {key!r} is used twice")
                seen.add(key)
        return self


class PatroniDiscoveryConfig(_Strict):
    """Where Patroni's REST API answers for this cluster; any one URL answering is enough."""

    kind: Literal["patroni"]
    urls: tuple[str, ...] = Field(min_length=1)
    username: str | None = None  # basic auth (Patroni's restapi.authentication)
    password_file: Path | None = None
    ca_file: Path | None = None  # to verify Patroni's certificate; default: the system's
    cert_file: Path | None = None  # a client certificate, when Patroni asks for one
    key_file: Path | None = None
    verify: bool = True
    timeout: PositiveDuration | None = None  # per URL asked; default: the cycle's budget, at most 2 s

    @field_validator("urls")
    @classmethod
    def _http_urls(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        for url in urls:
            parts = urllib.parse.urlsplit(url)
            try:
                port = parts.port  # raises for a port that is no number or past 65535
            except ValueError:
                port = 0
            if port == 0:
                raise ValueError(f"{url!r}: the port is not a number from 1 to 65535")
            if (parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc
                    or parts.path not in ("", "/") or parts.query or parts.fragment or re.search(r"\s", url)):
                raise ValueError(f"{url!r} is not an http:// or https:// URL of a Patroni REST API "
                                 "(scheme, host and port only)")
        return urls

    @model_validator(mode="after")
    def _files(self) -> PatroniDiscoveryConfig:
        if (self.username is None) != (self.password_file is None):
            raise ValueError("username and password_file go together (basic auth)")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (a client certificate)")
        for key in ("password_file", "ca_file", "cert_file", "key_file"):
            path = getattr(self, key)
            if path is not None and not os.access(path, os.R_OK):
                raise ValueError(f"{key} {str(path)!r} cannot be read")
        return self


class MemberTemplate(NodeConfig):
    """How to reach each discovered member: a DSN without host or port (Patroni gives those)."""

    @field_validator("dsn")
    @classmethod
    def _no_address(cls, dsn: str) -> str:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        given = sorted(k for k in ("host", "hostaddr", "port", "target_session_attrs") if k in params)
        if given:
            raise ValueError(f"must not set {', '.join(given)}: each member's host and port come from Patroni")
        return dsn


# The validation context of a cluster config made from discovered members (patroni.cluster_config).
DISCOVERED = "discovered"


class PatroniClusterConfig(_Strict):
    """A cluster whose members Patroni names: the same keys as a static cluster, with
    ``discovery`` and ``members`` instead of ``primary`` and ``replicas``."""

    name: str = Field(min_length=1)
    discovery: PatroniDiscoveryConfig
    members: MemberTemplate
    walinspect: Literal["auto", "off"] = "auto"
    walinspect_max_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    sla: SlaConfig = SlaConfig()
    pooler: PoolerConfig | None = None
    dry_run: bool = False
    leader_lock_key: str | None = Field(default=None, min_length=8)

    @model_validator(mode="after")
    def _pooler_fits_discovery(self) -> PatroniClusterConfig:
        # The writer DSN lists every member: no one address a pooler could route to. The
        # fallback to the primary routes to the leader member (by its name) instead.
        if isinstance(self.pooler, HAProxyPoolerConfig) and "primary" in self.pooler.servers:
            raise ValueError("pooler.servers: with discovery, map members by their Patroni names; 'primary' "
                             "is none of them (the leader is whichever member leads now)")
        if isinstance(self.pooler, PgBouncerPoolerConfig) and self.pooler.when_empty == "primary":
            raise ValueError("pooler.when_empty: with discovery only 'keep' is supported yet (the writer DSN "
                             "lists every member: it is no one address to point PgBouncer at)")
        return self


def _cluster_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "patroni" if "discovery" in value else "static"
    return "patroni" if isinstance(value, PatroniClusterConfig) else "static"


CLUSTER_KINDS = ("static", "patroni")
AnyClusterConfig = Annotated[
    Annotated[ClusterConfig, Tag("static")] | Annotated[PatroniClusterConfig, Tag("patroni")],
    Discriminator(_cluster_kind),
]


class ShardConfig(_Strict):
    """This instance's part of a fleet: clusters are spread over ``count`` shards by
    rendezvous hashing of their names (lagwatch.shard); run two instances per index for HA
    (the per-cluster leader lock decides which one acts on the pool)."""

    index: int = Field(ge=0)
    count: int = Field(ge=1, le=1024)

    @model_validator(mode="after")
    def _index_in_range(self) -> ShardConfig:
        if self.index >= self.count:
            raise ValueError(f"index {self.index} must be below count {self.count} (shards are 0 .. count-1)")
        return self

    def owns(self, cluster: str) -> bool:
        return shard_of(cluster, self.count) == self.index


class HttpConfig(_Strict):
    """The HTTP server's limits against slow or numerous clients (see httpserver.py)."""

    max_connections: int = Field(default=512, ge=1, le=100_000)  # also kept below the descriptor limit
    request_timeout: PositiveDuration = 10.0  # to read a whole request's headers, TLS handshake included
    idle_timeout: PositiveDuration = 60.0  # a kept-alive connection between two requests


class Config(_Strict):
    interval: PositiveDuration = 1.0
    window: PositiveDuration = 300.0
    # Over how long the rates that forecasts divide by are taken (replay and WAL generation
    # for catch-up ETAs, the net rate a slot's safe_wal_size shrinks at for its runway).
    forecast_horizon: PositiveDuration = 60.0
    listen: str = "127.0.0.1:9847"
    # Per-node budget for connecting and for one poll round trip; defaults from interval.
    connect_timeout: Duration | None = None
    query_timeout: Duration | None = None
    reconnect_backoff_max: Duration = 5.0
    state_dir: Path = Path("/var/lib/lagwatch")  # operator holds live here (holds.json)
    web_config_file: Path | None = None  # TLS and basic auth, Prometheus exporters' web config format
    http: HttpConfig = HttpConfig()
    shard: ShardConfig | None = None  # this instance's part of a fleet (unset: every cluster)
    # One YAML file per cluster (lagwatch.clusterdir), beside or instead of ``clusters``.
    clusters_dir: Path | None = None
    clusters: tuple[AnyClusterConfig, ...] = Field(default=(), validate_default=True)
    # The web config file's contents, set by load_config (not a key of the file).
    _web: WebConfig | None = PrivateAttr(default=None)

    @property
    def web(self) -> WebConfig | None:
        return self._web

    @field_validator("clusters_dir")
    @classmethod
    def _a_directory(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_dir():
            raise ValueError(f"{str(value)!r} is not a directory")
        return value

    @field_validator("clusters")
    @classmethod
    def _some_clusters(cls, value: tuple[AnyClusterConfig, ...], info: ValidationInfo) -> tuple[AnyClusterConfig, ...]:
        # (A clusters_dir that failed its own check is not in info.data: one error is enough.)
        if not value and "clusters_dir" in info.data and info.data["clusters_dir"] is None:
            raise ValueError("at least one cluster is needed (or a clusters_dir)")
        return value

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        split_listen(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Config:
        if self.window < self.interval:
            raise ValueError("window must be at least one interval")
        names = [c.name for c in self.clusters]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"cluster names must be unique, repeated: {', '.join(dupes)}")
        return self

    @property
    def clusters_with_nodes(self) -> tuple[ClusterConfig, ...]:
        """The clusters whose nodes are known: those the file names, and (in the config the
        daemon runs) the discovered ones as their members make them; of this shard's only."""
        return tuple(c for c in self.clusters if isinstance(c, ClusterConfig) and self.owns(c.name))

    @property
    def patroni_clusters(self) -> tuple[PatroniClusterConfig, ...]:
        return tuple(c for c in self.clusters if isinstance(c, PatroniClusterConfig) and self.owns(c.name))

    def owns(self, cluster: str) -> bool:
        """Whether this instance watches ``cluster`` (always, unless the fleet is sharded)."""
        return self.shard is None or self.shard.owns(cluster)

    @property
    def effective_query_timeout(self) -> float:
        # A hung node must be given up within the cycle so that the others keep cadence.
        return self.query_timeout if self.query_timeout else max(0.1, self.interval * 0.8)

    @property
    def effective_connect_timeout(self) -> float:
        return self.connect_timeout if self.connect_timeout else max(0.5, self.interval * 0.8)

    @property
    def cycle_budget(self) -> float:
        """How long a cycle waits for its nodes' answers. Below the interval, so that a hung
        or slowly connecting node (whose own deadlines may be longer: connecting at a
        100 ms interval still gets 0.5 s) never costs the others their cadence; its poll
        goes on in the background and its answer is taken by a later cycle."""
        return min(self.effective_query_timeout, self.interval * 0.8)

    @property
    def holds_file(self) -> Path:
        return self.state_dir / "holds.json"

    @property
    def listen_address(self) -> tuple[str, int]:
        return split_listen(self.listen)


def split_listen(value: str) -> tuple[str, int]:
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"port must be 1-65535, got {port_text!r}")
    return host.strip("[]"), int(port_text)


def parse_config(data: Any, source: str = "<config>") -> Config:
    if not isinstance(data, dict):
        raise ConfigError(source, ["(top level): expected a mapping of settings"])
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        tagged = {"pooler": POOLER_KINDS, "clusters": CLUSTER_KINDS}
        raise ConfigError(source, validation_problems(exc, tagged)) from None


def load_config(path: str | Path, web_config_file: Path | None = None) -> Config:
    """The config file and the web config file it names (or ``web_config_file``, given on
    the command line), both validated: every command and every reload loads through here,
    so all of them accept and reject exactly the same files."""
    source = str(path)
    data = load_yaml(Path(path))
    config = parse_config(data, source)
    web_file = web_config_file or config.web_config_file
    if web_file is not None:
        try:
            config._web = load_web_config(web_file)
        except ConfigError as exc:
            raise ConfigError(source, [f"web_config_file ({exc.source}): {p}" for p in exc.problems]) from None
    return config
