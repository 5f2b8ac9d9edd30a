"""The configuration: one YAML file, validated once, then a frozen typed object.

Every problem is reported at once, each with the path of the key it concerns
(``clusters[0].replicas[1].dsn: ...``). Nothing here ever echoes a password. The building
blocks are in base.py (durations, nodes, SLAs) and the pooler schemas in poolers.py; this
module is the whole file's schema and how it is loaded.
"""

from __future__ import annotations

import stat
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any

import psycopg.conninfo
from pydantic import (
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from lagwatch.config.base import (
    Duration,
    HeartbeatConfig,
    NodeConfig,
    PasswordUnavailableError,
    PositiveDuration,
    ReplicaSla,
    SlaConfig,
    SlaOverride,
    _Strict,
    node_name_problem,
    shown_path,
    stat_of,
)
from lagwatch.config.options import ClusterOptions
from lagwatch.config.patroni import MemberTemplate, PatroniClusterConfig, PatroniDiscoveryConfig
from lagwatch.config.poolers import (
    POOLED_HOST,
    POOLER_KINDS,
    CommandPoolerConfig,
    HAProxyPoolerConfig,
    PgBouncerPoolerConfig,
    PoolerConfig,
    TomlPoolerConfig,
    check_template,
)
from lagwatch.config.process import HttpConfig, ShardConfig
from lagwatch.config.web import WebConfig, load_web_config
from lagwatch.errors import ConfigError, validation_problems
from lagwatch.escape import excerpt
from lagwatch.yamlfile import load_yaml

__all__ = ["CLUSTER_KINDS", "DISCOVERED", "POOLED_HOST", "POOLER_KINDS", "AnyClusterConfig", "ClusterConfig",
           "CommandPoolerConfig", "Config", "Duration", "HAProxyPoolerConfig", "HeartbeatConfig", "HttpConfig",
           "MemberTemplate", "NodeConfig", "PasswordUnavailableError", "PatroniClusterConfig", "PatroniDiscoveryConfig",
           "PgBouncerPoolerConfig", "PoolerConfig", "PositiveDuration", "ReplicaConfig", "ReplicaSla",
           "ShardConfig", "SlaConfig", "SlaOverride", "TomlPoolerConfig", "check_template", "load_config",
           "parse_config", "split_listen"]


# The validation context of a cluster config made from discovered members (patroni.cluster_config).
DISCOVERED = "discovered"


class ReplicaConfig(NodeConfig):
    name: str = Field(min_length=1)
    # The replica's row in the primary's pg_stat_replication is found by this name.
    application_name: str | None = None
    sla: SlaOverride | None = None
    read_pool: bool = True  # false: measured, never routed to (Patroni's noloadbalance tag)

    @field_validator("name")
    @classmethod
    def _node_name(cls, name: str) -> str:
        problem = node_name_problem(name)
        if problem is not None:
            raise ValueError(problem)
        return name

    @property
    def walsender_name(self) -> str:
        return self.application_name or self.name


class ClusterConfig(ClusterOptions):
    primary: NodeConfig
    replicas: tuple[ReplicaConfig, ...] = ()
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
                    raise ValueError(f"{where}.dsn: {key} '{excerpt(value, 100)}' cannot be written into a pooler "
                                     "config (a host name, an IP address or a socket directory expected)")
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


def _cluster_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "patroni" if "discovery" in value else "static"
    return "patroni" if isinstance(value, PatroniClusterConfig) else "static"


CLUSTER_KINDS = ("static", "patroni")
AnyClusterConfig = Annotated[
    Annotated[ClusterConfig, Tag("static")] | Annotated[PatroniClusterConfig, Tag("patroni")],
    Discriminator(_cluster_kind),
]


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
    # The nodes one daemon polls at most, static and discovered together: Patroni's answers
    # that would take it past this are refused (each node is a connection, a poll a cycle).
    max_nodes: int = Field(default=2000, ge=1, le=100_000)
    # Show the query text (its first 200 characters) of the sessions on a replica that hold
    # replay back, in /api/status only: off, as queries may carry data the monitor's readers
    # should not see. Takes effect on each replica's next connection.
    conflict_query_text: bool = False
    web_config_file: Path | None = None  # TLS and basic auth, Prometheus exporters' web config format
    http: HttpConfig = HttpConfig()
    shard: ShardConfig | None = None  # this instance's part of a fleet (unset: every cluster)
    # One YAML file per cluster (lagwatch.sources.clusterdir), beside or instead of ``clusters``.
    clusters_dir: Path | None = None
    clusters: tuple[AnyClusterConfig, ...] = Field(default=(), validate_default=True)
    # The web config file's contents: given to the validation by load_config (not a key of the file).
    _web: WebConfig | None = PrivateAttr(default=None)

    def model_post_init(self, context: Any) -> None:
        """Take the web config load_config read (``context={"web": ...}``), as it is built:
        nothing is set on the model once it exists."""
        if isinstance(context, dict):
            self._web = context.get(WEB_CONFIG)

    @property
    def web(self) -> WebConfig | None:
        return self._web

    @field_validator("clusters_dir")
    @classmethod
    def _a_directory(cls, value: Path | None) -> Path | None:
        if value is not None:
            found = stat_of(value)
            if found is None or not stat.S_ISDIR(found.st_mode):
                raise ValueError(f"{shown_path(value)} is not a directory")
        return value

    @field_validator("state_dir")
    @classmethod
    def _a_place_for_state(cls, value: Path) -> Path:
        """A directory, or one lagwatch can make (it need not exist before the first hold):
        no part of the path is a file."""
        for path in (value, *value.parents):
            found = stat_of(path)
            if found is not None:
                if not stat.S_ISDIR(found.st_mode):
                    raise ValueError(f"{shown_path(path)} is not a directory (operator holds are kept in state_dir)")
                break
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
        raise ValueError(f"expected HOST:PORT, got '{excerpt(value)}'")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        # The whole value is shown, not what follows its last ':' (a URL's or a DSN's tail,
        # ``8008/TOKEN/``, would not look like a secret on its own).
        raise ValueError(f"port must be 1-65535, in '{excerpt(value)}'")
    return host.strip("[]"), int(port_text)


WEB_CONFIG = "web"  # the validation context's key for the web config's contents


def parse_config(data: Any, source: str = "<config>", web: WebConfig | None = None) -> Config:
    if not isinstance(data, dict):
        raise ConfigError(source, ["(top level): expected a mapping of settings"])
    try:
        return Config.model_validate(data, context={WEB_CONFIG: web})
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
    web = None
    if web_file is not None:
        try:
            web = load_web_config(web_file)
        except ConfigError as exc:
            raise ConfigError(source, [f"web_config_file ({exc.source}): {p}" for p in exc.problems]) from None
        config = parse_config(data, source, web)
    if config.conflict_query_text and (web is None or not web.basic_auth_users):
        # Other users' query text (a password in a connection string, a customer's data in
        # a WHERE clause) must not be served to whoever can reach the port.
        raise ConfigError(source, ["conflict_query_text: true serves other users' query text on /api/status: "
                                   "it needs a web_config_file with basic_auth_users"])
    return config
