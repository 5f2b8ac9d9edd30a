"""The keys of a cluster whose members Patroni names (lagwatch.sources.discovery asks its REST API)."""

from __future__ import annotations

import ipaddress
import os
import re
import urllib.parse
from pathlib import Path
from typing import Literal

import psycopg.conninfo
from pydantic import Field, field_validator, model_validator

from lagwatch.config.base import (
    NodeConfig,
    PositiveDuration,
    _Strict,
)
from lagwatch.config.options import ClusterOptions
from lagwatch.config.poolers import HAProxyPoolerConfig, PgBouncerPoolerConfig
from lagwatch.escape import excerpt, shown_url

_HOST_NAME = re.compile(r"\.?[A-Za-z0-9]([A-Za-z0-9-]{0,62}\.?)*")


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
    # An answer with more members is refused (the last good membership kept): each member
    # is a node polled, a connection held and a log line written, and a Patroni cluster
    # has a handful. Raise it for a bigger one.
    max_members: int = Field(default=32, ge=1, le=1000)
    # Where a member may be: Patroni and the DCS behind it are remote input, and a member
    # pointed at another host would be sent the members' password. Addresses or networks
    # (10.0.0.0/24, fd00::/64), host names (db1.example.com) or domains (.example.com).
    # Default (patroni.member_hosts): each URL host's network, its /24 (IPv6: /64), where it
    # is an address; where it is a name, that name and its domain (the name less its first
    # label; a name of one label: other names of one label).
    allowed_hosts: tuple[str, ...] | None = Field(default=None, min_length=1)

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, hosts: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for host in hosts or ():
            try:
                ipaddress.ip_network(host, strict=False)
            except ValueError:
                if not _HOST_NAME.fullmatch(host):
                    raise ValueError(f"'{excerpt(host)}' is no address, network (10.0.0.0/24), host name or "
                                     "domain (.example.com)") from None
        return hosts

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
                raise ValueError(f"{shown_url(url)!r}: the port is not a number from 1 to 65535")
            if (parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc
                    or parts.path not in ("", "/") or parts.query or parts.fragment or re.search(r"\s", url)):
                raise ValueError(f"{shown_url(url)!r} is not an http:// or https:// URL of a Patroni REST API "
                                 "(scheme, host and port only"
                                 + ("; credentials go in username and password_file" if "@" in parts.netloc else "")
                                 + ")")
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


class PatroniClusterConfig(ClusterOptions):
    """A cluster whose members Patroni names: the same options as a static cluster
    (config/options.py), with ``discovery`` and ``members`` instead of ``primary`` and
    ``replicas``."""

    discovery: PatroniDiscoveryConfig
    members: MemberTemplate

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
