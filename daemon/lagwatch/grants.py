"""`lagwatch check --grants`: per node, which grant is missing for which view, and which
granted privilege is more than lagwatch needs.

lagwatch needs pg_read_all_stats (LSNs in pg_stat_replication, pg_stat_wal_receiver's
columns) and EXECUTE on pg_ls_waldir(); pg_walinspect's pg_get_wal_stats() is optional.
pg_monitor is more: its pg_read_all_settings shows every replica's primary_conninfo,
password included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TextIO

import psycopg
import psycopg.rows

from lagwatch.config import ClusterConfig, Config, NodeConfig, PasswordUnavailableError
from lagwatch.conninfo import build_conninfo
from lagwatch.discovery import with_members_now
from lagwatch.patroni import DiscoveryError
from lagwatch.redact import redact_text
from lagwatch.views import probe

OK, MISSING, UNREACHABLE = 0, 2, 3


@dataclass(frozen=True)
class NodeGrants:
    node: str
    user: str
    missing: dict[str, str]  # view -> the GRANT that gives it
    optional_missing: dict[str, str]
    excess: list[str]
    error: str | None = None


def missing_grants(caps: probe.Capabilities, user: str) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """What this node's role lacks for each view it reads (pure)."""
    def grant(view: str) -> str:
        return probe.GRANTS[view].replace("ROLE", user)

    missing: dict[str, str] = {}
    optional: dict[str, str] = {}
    if not caps.can_read_all_stats:
        missing["replication" if not caps.in_recovery else "wal_receiver"] = grant("replication")
    if not caps.can_ls_waldir:
        missing["wal_dir"] = grant("wal_dir")
    if caps.has_walinspect and not caps.can_walinspect and not caps.in_recovery:
        optional["walinspect"] = grant("walinspect")
    elif caps.has_walinspect and not caps.can_walinspect_blocks and not caps.in_recovery and caps.major >= 16:
        optional["walinspect_blocks"] = grant("walinspect_blocks")
    if caps.has_walinspect and not caps.can_walinspect_records and not caps.in_recovery:
        optional["wal_dating"] = grant("wal_dating")
    excess = []
    if caps.can_read_all_settings:
        excess.append("pg_read_all_settings (e.g. through pg_monitor): it shows each replica's primary_conninfo, "
                      "password included; lagwatch does not need it")
    return missing, optional, excess


def _check_node(node_name: str, node: NodeConfig, timeout: float) -> NodeGrants:
    try:
        conninfo = build_conninfo(node, timeout, timeout)
        with psycopg.connect(conninfo, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
            rows = conn.execute(probe.SQL).fetchall()
            user = str(conn.execute("SELECT current_user AS u").fetchone()["u"])  # type: ignore[index]
    except (psycopg.Error, OSError, PasswordUnavailableError) as exc:
        secret = None
        try:
            secret = node.password()
        except PasswordUnavailableError:
            pass
        return NodeGrants(node_name, "?", {}, {}, [], redact_text(str(exc).strip().splitlines()[0], [secret]))
    missing, optional, excess = missing_grants(probe.parse(rows), user)
    return NodeGrants(node_name, user, missing, optional, excess)


def _nodes(cluster: ClusterConfig) -> list[tuple[str, NodeConfig]]:
    return [("primary", cluster.primary), *((r.name, r) for r in cluster.replicas)]


def run_grants_check(config: Config, out: TextIO) -> int:
    worst = OK
    try:
        config = with_members_now(config)
    except DiscoveryError as exc:
        print(f"UNKNOWN {exc}", file=out)
        return UNREACHABLE
    for cluster in config.clusters_with_nodes:
        for name, node in _nodes(cluster):
            result = _check_node(name, node, config.effective_connect_timeout)
            where = f"{cluster.name}/{name}"
            if result.error is not None:
                print(f"{where}: UNKNOWN cannot connect: {result.error}", file=out)
                worst = max(worst, UNREACHABLE)
                continue
            if result.missing:
                worst = max(worst, MISSING)
                for view, grant in sorted(result.missing.items()):
                    print(f"{where}: MISSING for {view}: {grant}", file=out)
            for view, grant in sorted(result.optional_missing.items()):
                print(f"{where}: optional, for {view}: {grant}", file=out)
            for excess in result.excess:
                print(f"{where}: more than needed: {excess}", file=out)
            if not result.missing:
                print(f"{where}: ok as {result.user} (every view lagwatch reads each cycle)", file=out)
    return worst
