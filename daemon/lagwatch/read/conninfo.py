"""The connection string lagwatch connects with: the node's DSN plus what lagwatch always
sets (its application_name, a statement_timeout), and the password, read only here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg.conninfo

from lagwatch.config import NodeConfig


def search_path(schemas: Sequence[str] = ("public",)) -> str:
    """The search_path every lagwatch session sets: pg_catalog first, the schemas the
    operator names (``schemas``: where pg_walinspect and the heartbeat table are), pg_temp
    last. Never ``$user``: a role with CREATE on the database could make a schema named as
    lagwatch's login, with a heartbeat table carrying a trigger or a function named as
    pg_walinspect's, and lagwatch would write into or run them as itself."""
    return ",".join(["pg_catalog", *schemas, "pg_temp"])


def build_conninfo(node: NodeConfig, connect_timeout: float, statement_timeout: float,
                   application_name: str = "lagwatch", schemas: Sequence[str] = ("public",)) -> str:
    """The node's DSN plus what lagwatch always sets; the password is added only here."""
    params = psycopg.conninfo.conninfo_to_dict(node.dsn)
    options = str(params.get("options", ""))
    extra: dict[str, Any] = {
        "application_name": application_name,
        # The real deadline is the client-side one, counted in lagwatch's attention
        # (session.py): a late lagwatch gives up on nobody. libpq's (whole seconds, wall
        # clock) is only the backstop for a lagwatch that stays late for that long.
        "connect_timeout": max(10, round(4 * connect_timeout)),
        # Set as the connection's options, after the DSN's own: they take precedence over
        # the role's and the database's settings (ALTER ROLE ... SET search_path).
        "options": (f"{options} -c statement_timeout={max(1, int(statement_timeout * 1000))} "
                    f"-c search_path={search_path(schemas)}").strip(),
    }
    password = node.password()
    if password is not None:
        extra["password"] = password
    return psycopg.conninfo.make_conninfo(node.dsn, **extra)


def poller_application_name(cluster: str, node: str) -> str:
    """What a node's polling session calls itself on the server: ``lagwatch/CLUSTER/NODE``
    (PostgreSQL keeps 63 bytes of it), so an operator, or a test, finds each node's one
    session in pg_stat_activity."""
    return f"lagwatch/{cluster}/{node}"


_ADDRESS_KEYS = ("host", "hostaddr", "port")


def serves_as(old: NodeConfig, new: NodeConfig, connected: tuple[str, int] | None) -> bool:
    """Whether a session opened with ``old``, now connected to ``connected`` (host, port),
    may go on serving ``new``: the same settings but for the host list, and the server it
    is on still in that list. Discovery adds and removes members from the writer's
    multi-host DSN; the session on the leader need not be dropped for that (nor the leader
    lock it holds)."""
    if old == new:
        return True
    if connected is None or old.model_copy(update={"dsn": ""}) != new.model_copy(update={"dsn": ""}):
        return False
    before, after = (psycopg.conninfo.conninfo_to_dict(c.dsn) for c in (old, new))
    if {k: v for k, v in before.items() if k not in _ADDRESS_KEYS} != \
            {k: v for k, v in after.items() if k not in _ADDRESS_KEYS} or "hostaddr" in after:
        return False
    hosts = str(after.get("host", "")).split(",")
    ports = str(after.get("port", "5432")).split(",")
    ports = ports * len(hosts) if len(ports) == 1 else ports
    return (connected[0], str(connected[1])) in set(zip(hosts, ports, strict=False))


def connected_address(conn: Any) -> tuple[str, int] | None:
    """The (host, port) an open psycopg connection is on, as its DSN named it."""
    if conn is None or conn.closed:
        return None
    return str(conn.info.host), int(conn.info.port)
