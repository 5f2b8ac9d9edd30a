"""`lagwatch check --grants`: per node, which grant is missing for which view, and which
granted privilege is more than lagwatch needs.

lagwatch needs pg_read_all_stats (LSNs in pg_stat_replication, pg_stat_wal_receiver's
columns) and EXECUTE on pg_ls_waldir(); pg_walinspect's functions are optional (on a
primary it says what its replicas are dated by, and how to date them from the WAL). Anything
more is flagged, as a Nagios check would: superuser, membership in a superuser role (SET
ROLE makes one), and the roles that make one (pg_execute_server_program,
pg_write_server_files), CRITICAL; the other attributes and roles that reach past
monitoring (REPLICATION, CREATEROLE, CREATEDB, BYPASSRLS, reading server files or every
table, signalling other sessions, CHECKPOINT, owning objects), EXECUTE on the functions
that reach the server's files, write grants on tables, ALTER SYSTEM or SET granted on
parameters, WARNING, and so pg_monitor's pg_read_all_settings, which shows every
replica's primary_conninfo, password included. Each counts what the login role has itself
or through any role it is a member of.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

import psycopg
import psycopg.rows

from lagwatch import rooms
from lagwatch.config import ClusterConfig, Config, NodeConfig, PasswordUnavailableError
from lagwatch.escape import escape_controls
from lagwatch.read.conninfo import build_conninfo
from lagwatch.redact import redact_text
from lagwatch.sources.discovery import with_members_now
from lagwatch.sources.patroni import DiscoveryError
from lagwatch.views import probe

OK, WARNING, MISSING, UNREACHABLE = 0, 1, 2, 3
CRITICAL = MISSING
STATES = {WARNING: "WARNING", CRITICAL: "CRITICAL"}

# Predefined roles beyond monitoring, by what they let a session do, and how bad that is.
POWERS = {
    "pg_execute_server_program": (CRITICAL, "runs programs on the server as the postgres user (COPY ... PROGRAM)"),
    "pg_write_server_files": (CRITICAL, "writes files on the server as the postgres user"),
    "pg_read_server_files": (WARNING, "reads any file the postgres user can (for pg_walinspect, grant EXECUTE on "
                                      "its functions instead)"),
    "pg_signal_backend": (WARNING, "cancels and terminates other sessions"),
    "pg_read_all_data": (WARNING, "reads every table"),
    "pg_write_all_data": (WARNING, "writes every table"),
    "pg_create_subscription": (WARNING, "creates subscriptions: connections out of the server"),
    "pg_checkpoint": (WARNING, "runs CHECKPOINT: forces the whole server's dirty pages to disk"),
}
# Functions revoked from PUBLIC that read the server's files or act on the server, by what
# EXECUTE on one lets a session do (granted directly, or to a role it is a member of).
FUNCTIONS = {
    "pg_read_file(text)": "reads files on the server", "pg_read_binary_file(text)": "reads files on the server",
    "pg_ls_dir(text)": "lists the server's directories", "pg_stat_file(text)": "reads the server's file metadata",
    "lo_import(text)": "reads files on the server into large objects",
    "lo_export(oid,text)": "writes files on the server", "pg_reload_conf()": "reloads the server's configuration",
    "pg_promote(boolean,integer)": "promotes a standby",
}
ATTRIBUTES = {
    "replication": "REPLICATION: streams the whole WAL (every row written) and makes slots that hold WAL back",
    "createrole": "CREATEROLE: creates roles and grants the roles it administers",
    "createdb": "CREATEDB: creates databases",
    "bypassrls": "BYPASSRLS: row-level security does not apply to it",
}
# What the login role can do, itself or as any role it is a member of (pg_has_role MEMBER:
# a role it can SET ROLE to lends it everything that role has, attributes included). The
# parameter ACL is 15+ (GRANT ALTER SYSTEM / SET ON PARAMETER).
_PRIVILEGES_SQL = """WITH mine AS (SELECT b.* FROM pg_catalog.pg_roles b, pg_catalog.pg_roles r
                 WHERE r.rolname = current_user AND pg_catalog.pg_has_role(r.oid, b.oid, 'MEMBER'))
SELECT bool_or(rolsuper) FILTER (WHERE rolname = current_user) AS superuser, bool_or(rolreplication) AS replication,
       bool_or(rolcreaterole) AS createrole, bool_or(rolcreatedb) AS createdb, bool_or(rolbypassrls) AS bypassrls,
       bool_or(rolsuper) FILTER (WHERE rolname <> current_user) AS through_superuser,
       ARRAY(SELECT rolname::text FROM mine WHERE rolname = ANY(%(powers)s) ORDER BY 1) AS memberships,
       (SELECT count(*) FROM pg_catalog.pg_class WHERE relowner IN (SELECT oid FROM mine))
       + (SELECT count(*) FROM pg_catalog.pg_proc WHERE proowner IN (SELECT oid FROM mine))
       + (SELECT count(*) FROM pg_catalog.pg_namespace WHERE nspowner IN (SELECT oid FROM mine))
       + (SELECT count(*) FROM pg_catalog.pg_database WHERE datdba IN (SELECT oid FROM mine)) AS owned,
       ARRAY(SELECT f FROM unnest(%(functions)s::text[]) f
             WHERE pg_catalog.to_regprocedure(f) IS NOT NULL
               AND pg_catalog.has_function_privilege(current_user, f, 'EXECUTE') ORDER BY 1) AS functions,
       (SELECT count(*) FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
        WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
          AND c.oid <> coalesce(pg_catalog.to_regclass(%(heartbeat)s), 0)
          AND pg_catalog.has_table_privilege(current_user, c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE')) AS writable,
       {parameters} AS parameters
FROM mine"""
_PARAMETERS_SQL = """ARRAY(SELECT DISTINCT p.parname::text FROM pg_catalog.pg_parameter_acl p,
             pg_catalog.aclexplode(p.paracl) a
             WHERE a.grantee IN (SELECT oid FROM mine) AND a.privilege_type IN ('ALTER SYSTEM', 'SET') ORDER BY 1)"""


def privileges_sql(version_num: int) -> str:
    """_PRIVILEGES_SQL for a server of ``version_num`` (the parameter ACL is 15+)."""
    return _PRIVILEGES_SQL.format(parameters=_PARAMETERS_SQL if version_num >= 150000 else "ARRAY[]::text[]")


@dataclass(frozen=True)
class NodeGrants:
    node: str
    user: str
    missing: dict[str, str]  # view -> the GRANT that gives it
    optional_missing: dict[str, str]
    excess: list[tuple[int, str]]  # (WARNING or CRITICAL, what is more than lagwatch needs)
    error: str | None = None
    dating: str | None = None  # on a primary: what its replicas are dated by (dating_arm)


def missing_grants(caps: probe.Capabilities, user: str) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """What this node's role lacks for each view it reads (pure)."""
    def grant(view: str) -> str:
        return probe.GRANTS[view].replace("ROLE", user)

    missing: dict[str, str] = {}
    optional: dict[str, str] = {}
    if not caps.can_read_all_stats:
        missing["replication" if not caps.in_recovery else "wal_receiver"] = grant("replication")
    if caps.has_walinspect and not caps.can_walinspect and not caps.in_recovery:
        optional["walinspect"] = grant("walinspect")
    elif caps.has_walinspect and not caps.can_walinspect_blocks and not caps.in_recovery and caps.major >= 16:
        optional["walinspect_blocks"] = grant("walinspect_blocks")
    if caps.has_walinspect and not caps.can_walinspect_records and not caps.in_recovery:
        optional["wal_dating"] = grant("wal_dating")
    for room, needed in rooms.missing_grants(caps):  # each room's own (lagwatch.rooms)
        missing[room.name] = needed.statement.replace("ROLE", user) + (
            f" (without it, not read: {needed.reads})" if needed.reads else "")
    excess = []
    if caps.can_read_all_settings:
        excess.append("pg_read_all_settings (e.g. through pg_monitor): it shows each replica's primary_conninfo, "
                      "password included; lagwatch does not need it")
    return missing, optional, excess


def dating_arm(caps: probe.Capabilities, user: str, lag_from_wal: str) -> str | None:
    """On a primary: what its replicas' staleness is dated by (estimate/dating.py), and
    where that is not the WAL, the exact statements that make it so (pure). None on a
    replica."""
    if caps.in_recovery:
        return None
    clock = "the LSN clock and commit timestamps (no WAL dating: they read low under load, docs/lag.md)"
    grant = probe.GRANTS["wal_dating"].replace("ROLE", user).removesuffix(" (optional)") + ";"
    if lag_from_wal == "off":
        return f"{clock}: lag_from_wal is off in the config"
    if caps.major < 15:
        return f"{clock}: PostgreSQL {caps.major} has no pg_walinspect (15+)"
    if not caps.has_walinspect:
        return f"{clock}; to date them from the WAL, in this database: CREATE EXTENSION pg_walinspect; {grant}"
    if not caps.can_walinspect_records:
        return f"{clock}; to date them from the WAL: {grant}"
    return "the WAL (pg_walinspect: the first commit past each replica's position)"


def excess_privileges(role: Mapping[str, Any]) -> list[tuple[int, str]]:
    """What the role's attributes, memberships and ownership give beyond what lagwatch
    needs, each with its severity (pure; ``role``: a row of _PRIVILEGES_SQL)."""
    if role["superuser"]:
        return [(CRITICAL, "superuser: every privilege there is (deploy/sql/lagwatch-role.sql makes the role "
                           "lagwatch needs)")]
    if role.get("through_superuser"):
        return [(CRITICAL, "a member of a superuser role: SET ROLE makes it one (every privilege there is)")]
    out = [(WARNING, text) for key, text in ATTRIBUTES.items() if role[key]]
    out += [(POWERS[name][0], f"{name}: {POWERS[name][1]}") for name in role["memberships"] if name in POWERS]
    if role["owned"]:
        out.append((WARNING, f"owns {role['owned']} object(s) in this database (tables, functions, schemas or the "
                             "database itself), itself or through a role it is a member of: full control of them"))
    out += [(WARNING, f"EXECUTE on {f}: {FUNCTIONS[f]}") for f in role.get("functions") or () if f in FUNCTIONS]
    if role.get("writable"):
        out.append((WARNING, f"writes {role['writable']} table(s) in this database (INSERT, UPDATE, DELETE or "
                             "TRUNCATE; lagwatch writes only its heartbeat table)"))
    if role.get("parameters"):
        out.append((WARNING, "ALTER SYSTEM or SET granted on parameter(s): " + ", ".join(role["parameters"])))
    return out


def _check_node(node_name: str, node: NodeConfig, timeout: float, lag_from_wal: str,
                heartbeat_table: str | None = None, schemas: tuple[str, ...] = ("public",)) -> NodeGrants:
    try:
        conninfo = build_conninfo(node, timeout, timeout, schemas=schemas)
        with psycopg.connect(conninfo, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
            rows = conn.execute(probe.sql(rooms.probe_columns())).fetchall()
            user = str(conn.execute("SELECT current_user AS u").fetchone()["u"])  # type: ignore[index]
            role = conn.execute(privileges_sql(conn.info.server_version).encode(),
                                {"powers": list(POWERS), "functions": list(FUNCTIONS),
                                 "heartbeat": heartbeat_table}).fetchone()
    except (psycopg.Error, OSError, PasswordUnavailableError) as exc:
        secret = None
        try:
            secret = node.password()
        except PasswordUnavailableError:
            pass
        return NodeGrants(node_name, "?", {}, {}, [], redact_text(str(exc).strip().splitlines()[0], [secret]))
    caps = probe.parse(rows)
    missing, optional, settings = missing_grants(caps, user)
    excess = excess_privileges(role) if role is not None else []
    if not (role or {}).get("superuser"):  # a superuser's one line says it all
        excess += [(WARNING, text) for text in settings]
    return NodeGrants(node_name, user, missing, optional, excess, dating=dating_arm(caps, user, lag_from_wal))


def _nodes(cluster: ClusterConfig) -> list[tuple[str, NodeConfig]]:
    return [("primary", cluster.primary), *((r.name, r) for r in cluster.replicas)]


def run_grants_check(config: Config, out: TextIO) -> int:
    worst = OK
    try:
        config = with_members_now(config)
    except DiscoveryError as exc:
        print(escape_controls(f"UNKNOWN {exc}"), file=out)
        return UNREACHABLE
    for cluster in config.clusters_with_nodes:
        for name, node in _nodes(cluster):
            result = _check_node(name, node, config.effective_connect_timeout, cluster.lag_from_wal,
                                 cluster.heartbeat.table if cluster.heartbeat is not None else None, cluster.schemas)
            where = f"{cluster.name}/{name}"
            if result.error is not None:
                print(escape_controls(f"{where}: UNKNOWN cannot connect: {result.error}"), file=out)
                worst = max(worst, UNREACHABLE)
                continue
            if result.missing:
                worst = max(worst, MISSING)
                for view, grant in sorted(result.missing.items()):
                    print(escape_controls(f"{where}: MISSING for {view}: {grant}"), file=out)
            for view, grant in sorted(result.optional_missing.items()):
                print(escape_controls(f"{where}: optional, for {view}: {grant}"), file=out)
            for state, excess in result.excess:
                worst = max(worst, state)
                print(escape_controls(f"{where}: {STATES[state]} more than needed: {excess}"), file=out)
            if not result.missing:
                print(escape_controls(f"{where}: ok as {result.user} (every view lagwatch reads each cycle)"), file=out)
            if result.dating is not None:
                print(escape_controls(f"{where}: replicas dated by {result.dating}"), file=out)
    return worst
