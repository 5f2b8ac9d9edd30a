"""Patroni discovery: a cluster's members as Patroni's REST API names them (``GET /cluster``).

``fetch_membership`` is the only I/O: it asks the configured URLs in turn (any one
answering is enough), over TLS and with basic auth when configured, each within a
deadline. The stdlib's ``urllib`` does this in a worker thread: one small GET per cycle
needs no HTTP client library. ``parse_cluster`` and ``cluster_config`` are pure: the
answer becomes an immutable ``Membership``, and a membership plus the cluster's template
becomes an ordinary ``ClusterConfig``:

- every member is a node named as in Patroni, reached at Patroni's host and port with the
  ``members`` DSN; its ``application_name`` (the primary's ``pg_stat_replication`` row) is
  the member name, as Patroni sets it;
- the writer DSN lists every member with ``target_session_attrs=read-write``, so it finds
  the leader whoever it is: a switchover changes roles (observed each cycle), not config;
- a member tagged ``noloadbalance`` never enters the read pool;
- a standby cluster (Patroni's ``standby_leader`` role) is watched as one: the writer DSN
  reaches the standby leader, and the other members' staleness is measured against it.
"""

from __future__ import annotations

import base64
import http.client
import ipaddress
import json
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg.conninfo

from lagwatch.config import (
    DISCOVERED,
    ClusterConfig,
    NodeConfig,
    PatroniClusterConfig,
    PatroniDiscoveryConfig,
    ReplicaConfig,
)
from lagwatch.config.base import NODE_NAME_RULE, node_name_problem
from lagwatch.config.options import ClusterOptions
from lagwatch.escape import excerpt, shown_url

# A member's host as Patroni gives it: a host name or an IPv4 or IPv6 address, nothing a
# connection string or a pooler's file could read as more (spaces, quotes, '=', ',').
MEMBER_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}|[0-9A-Fa-f:.]{2,45}")
MAX_ANSWER_BYTES = 1 << 20  # a /cluster answer of 1 MiB would be ~5,000 members: not Patroni


class DiscoveryError(Exception):
    """No configured URL gave a usable answer; the message says what each one did."""


@dataclass(frozen=True)
class Member:
    name: str
    role: str  # leader, replica, sync_standby, quorum_standby, standby_leader (as Patroni says)
    state: str  # running, streaming, stopped, starting...
    host: str
    port: int
    timeline: int | None
    noloadbalance: bool
    nofailover: bool


@dataclass(frozen=True)
class Membership:
    members: tuple[Member, ...]  # sorted by name
    source: str  # the URL that answered

    @property
    def addresses(self) -> tuple[tuple[str, str, int, bool, bool], ...]:
        """What the polled nodes and the pool are built from: a change here (a member
        added or removed, moved, tagged, or another standby leader) rebuilds them; other
        roles and states do not (they are observed on the servers every cycle)."""
        return tuple((m.name, m.host, m.port, m.noloadbalance, m.role == "standby_leader") for m in self.members)

    @property
    def standby_leader(self) -> Member | None:
        return next((m for m in self.members if m.role == "standby_leader"), None)

    @property
    def leader(self) -> Member | None:
        return next((m for m in self.members if m.role in ("leader", "standby_leader")), None)


def _word(value: Any) -> str:
    """A member's role or state as Patroni says it (leader, sync_standby, streaming, ...), or
    ``unknown`` for anything else: it is shown and logged, so only a word passes."""
    return value if isinstance(value, str) and _WORD.fullmatch(value) else "unknown"


_WORD = re.compile(r"[a-z][a-z_ ]{0,31}")


def _flag(tags: Mapping[str, Any], name: str) -> bool:
    value = tags.get(name, False)
    return value is True or (isinstance(value, str) and value.lower() in ("true", "on", "yes", "1"))


@dataclass(frozen=True)
class HostRule:
    """Where a discovered member may be (PatroniDiscoveryConfig.allowed_hosts)."""

    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    names: frozenset[str] = frozenset()
    domains: tuple[str, ...] = ()  # ".example.com": any name in it
    single_labels: bool = False  # names of one label (a URL host named so: the same search domain)
    said: str = ""  # the rule as a message says it

    def allows(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            name = host.lower().rstrip(".")
            return (name in self.names or any(name.endswith(d) for d in self.domains)
                    or (self.single_labels and "." not in name))
        return any(address in network for network in self.networks)


def member_hosts(config: PatroniDiscoveryConfig) -> HostRule:
    """Where this discovery's members may be: ``allowed_hosts``, or by default each URL
    host's network (/24, IPv6 /64) or, for a name, that name and its domain."""
    networks, names, domains, single = [], set(), [], False
    given = config.allowed_hosts
    entries = given if given is not None else tuple(urllib.parse.urlsplit(u).hostname or "" for u in config.urls)
    for entry in entries:
        try:
            if given is None:
                address = ipaddress.ip_address(entry)
                prefix = 24 if address.version == 4 else 64
                networks.append(ipaddress.ip_network(f"{address}/{prefix}", strict=False))
            else:
                networks.append(ipaddress.ip_network(entry, strict=False))
            continue
        except ValueError:
            pass
        name = entry.lower().rstrip(".")
        if name.startswith("."):
            domains.append(name)
        elif given is not None:
            names.add(name)
        else:
            names.add(name)
            if "." in name:
                domains.append("." + name.split(".", 1)[1])
            else:
                single = True
    networks = list(dict.fromkeys(networks))  # URLs on one network name it once
    shown = ", ".join([*(str(n) for n in networks), *sorted(names), *(f"*{d}" for d in domains)])
    said = f"allowed_hosts ({'as configured' if given is not None else 'by default, from the URLs'}: {shown})"
    return HostRule(tuple(networks), frozenset(names), tuple(domains), single, said)


def parse_cluster(payload: Any, source: str, max_members: int = 32, hosts: HostRule | None = None) -> Membership:
    """A ``GET /cluster`` answer as a Membership; DiscoveryError if it is not one, or has
    more than ``max_members`` members (checked before any is read)."""
    members = payload.get("members") if isinstance(payload, dict) else None
    if not isinstance(members, list):
        raise DiscoveryError(f"{source}: the answer has no members list")
    if len(members) > max_members:
        raise DiscoveryError(f"{source}: {len(members)} members, more than max_members ({max_members}): refused")
    out = []
    for entry in members:
        if not isinstance(entry, dict):
            raise DiscoveryError(f"{source}: a member is not an object")
        name, host, port = entry.get("name"), entry.get("host"), entry.get("port")
        # Remote input: each value checked against what it may be before anything uses it
        # (a name becomes a pooler file's line, a host a connection's target).
        if not isinstance(name, str) or node_name_problem(name) is not None:
            raise DiscoveryError(f"{source}: a member has no usable name ({excerpt(repr(name))}: "
                                 f"{NODE_NAME_RULE}, not 'primary')")
        if not isinstance(host, str) or not MEMBER_HOST.fullmatch(host) or not isinstance(port, int) \
                or isinstance(port, bool) or not 0 < port < 65536:
            raise DiscoveryError(f"{source}: member {name} has no usable host and port")
        if hosts is not None and not hosts.allows(host):
            raise DiscoveryError(f"{source}: member {name} is at {host}, outside {hosts.said}: refused (its "
                                 "connection would carry the members' password)")
        tags = entry.get("tags")
        tags = tags if isinstance(tags, dict) else {}
        timeline = entry.get("timeline")
        out.append(Member(name=name, role=_word(entry.get("role")), state=_word(entry.get("state")),
                          host=host, port=port, timeline=timeline if isinstance(timeline, int) else None,
                          noloadbalance=_flag(tags, "noloadbalance"), nofailover=_flag(tags, "nofailover")))
    names = [m.name for m in out]
    if len(set(names)) != len(names):
        raise DiscoveryError(f"{source}: a member name appears twice")
    return Membership(tuple(sorted(out, key=lambda m: m.name)), source)


def _ssl_context(config: PatroniDiscoveryConfig) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(config.ca_file) if config.ca_file else None)
    if config.cert_file is not None and config.key_file is not None:
        context.load_cert_chain(str(config.cert_file), str(config.key_file))
    if not config.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _auth_header(config: PatroniDiscoveryConfig) -> dict[str, str]:
    if config.username is None or config.password_file is None:
        return {}
    try:
        password = config.password_file.read_text().rstrip("\r\n")
    except OSError as exc:
        raise DiscoveryError(f"cannot read {config.password_file}: {exc.strerror or exc}") from None
    token = base64.b64encode(f"{config.username}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer of its own (``HTTP 307``), never followed: following it
    would send the basic-auth header to wherever the redirect points."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _opener(config: PatroniDiscoveryConfig) -> urllib.request.OpenerDirector:
    handlers: list[urllib.request.BaseHandler] = [_NoRedirects()]
    if any(u.startswith("https:") for u in config.urls):
        try:
            handlers.append(urllib.request.HTTPSHandler(context=_ssl_context(config)))
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError: a bad cert, key or CA file
            raise DiscoveryError(f"TLS set-up failed: {exc}") from None
    return urllib.request.build_opener(*handlers)


def answer_limit(max_members: int) -> int:
    """The most bytes a ``/cluster`` answer of ``max_members`` members may take: a member
    is a few hundred bytes (name, role, state, host, port, API URL, timeline, lag, tags),
    allowed 2 kB, and the answer is refused unread past that, never parsed into objects."""
    return min(MAX_ANSWER_BYTES, 16384 + 2048 * max_members)


def _read_within(answer: http.client.HTTPResponse, deadline: float, url: str, max_members: int) -> bytes:
    """The body, read one socket receive at a time so that a server trickling bytes
    cannot hold the worker past ``deadline`` (urllib's timeout bounds each receive only)."""
    chunks, size, limit = [], 0, answer_limit(max_members)
    while chunk := answer.read1(65536):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise DiscoveryError(f"{url}: answer larger than {limit} bytes, more than max_members ({max_members}) "
                                 "members take: refused")
        if time.monotonic() > deadline:
            raise DiscoveryError(f"{url}: answer not complete in time")
    return b"".join(chunks)


def fetch_membership(config: PatroniDiscoveryConfig, timeout: float) -> Membership:
    """The first good ``/cluster`` answer among the URLs, each asked within ``timeout``.
    Every failure, whatever its kind, is a DiscoveryError naming the URL."""
    headers = {"Accept": "application/json", **_auth_header(config)}
    opener = _opener(config)
    problems = []
    for base in config.urls:
        url = base.rstrip("/") + "/cluster"
        shown = shown_url(url)  # what messages and the members' source name: no token in a log
        try:
            with opener.open(urllib.request.Request(url, headers=headers), timeout=timeout) as answer:
                body = _read_within(answer, time.monotonic() + timeout, shown, config.max_members)
            return parse_cluster(json.loads(body), shown_url(base), config.max_members, member_hosts(config))
        except urllib.error.HTTPError as exc:
            problems.append(f"{shown}: HTTP {exc.code}")
        except urllib.error.URLError as exc:
            problems.append(f"{shown}: {getattr(exc.reason, 'strerror', None) or exc.reason}")
        except DiscoveryError as exc:
            problems.append(str(exc))
        except (ValueError, RecursionError):  # not JSON (or JSON nested past the parser)
            problems.append(f"{shown}: not JSON")
        except (OSError, http.client.HTTPException) as exc:  # reset, timeout, a broken status line
            problems.append(f"{shown}: {getattr(exc, 'strerror', None) or type(exc).__name__}: {exc}")
    raise DiscoveryError("; ".join(problems))


VERIFYING = ("verify-ca", "verify-full")  # the sslmodes in which only the real server can answer


def member_auth(template: str) -> dict[str, str]:
    """What a discovered member's DSN adds to the template's about authentication. A host
    Patroni names is remote input (allowed_hosts bounds where it may be, not who answers
    there): the password is never sent to it in clear (``require_auth=!password``, libpq
    16+; md5 and SCRAM prove it without sending it), unless the template sets its own
    ``require_auth`` or verifies the server's certificate (``sslmode`` verify-ca or
    verify-full). Everything else the template sets (sslmode, sslrootcert, gssencmode...)
    applies to every member as written, as to a static node."""
    params = psycopg.conninfo.conninfo_to_dict(template)
    if "require_auth" in params or params.get("sslmode") in VERIFYING or psycopg.pq.version() < 160000:
        return {}
    return {"require_auth": "!password"}


def _member_dsn(template: str, hosts: list[str], ports: list[int], **extra: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(template)
    params.update(host=",".join(hosts), port=",".join(str(p) for p in ports), **member_auth(template), **extra)
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})


def cluster_config(cluster: PatroniClusterConfig, membership: Membership) -> ClusterConfig:
    """The ordinary cluster config these members make (raises pydantic's ValidationError
    when they do not make a valid one, e.g. an HAProxy mapping naming no member)."""
    template = cluster.members
    members = membership.members
    password_file, password_env = template.password_file, template.password_env
    standby = membership.standby_leader
    # A standby cluster has no member that accepts writes: its standby leader stands for the primary.
    writer = (_member_dsn(template.dsn, [standby.host], [standby.port]) if standby is not None
              else _member_dsn(template.dsn, [m.host for m in members], [m.port for m in members],
                               target_session_attrs="read-write"))
    primary = NodeConfig(dsn=writer, password_file=password_file, password_env=password_env)
    replicas = tuple(ReplicaConfig(name=m.name, dsn=_member_dsn(template.dsn, [m.host], [m.port]),
                                   application_name=m.name, read_pool=not m.noloadbalance,
                                   password_file=password_file, password_env=password_env)
                     for m in members)
    # Every option the two kinds of cluster share (config/options.py) carries over, by name: a
    # list written out here once left horizon_alert_xids behind.
    shared = {name: getattr(cluster, name) for name in ClusterOptions.model_fields}
    fields = {**shared, "primary": primary, "replicas": replicas, "standby_cluster": standby is not None}
    return ClusterConfig.model_validate(fields, context={DISCOVERED: True})
