"""The connection string lagwatch connects with: the node's DSN plus what lagwatch always
sets (its application_name, a statement_timeout), and the password, read only here."""

from __future__ import annotations

from typing import Any

import psycopg.conninfo

from lagwatch.config import NodeConfig


def build_conninfo(node: NodeConfig, connect_timeout: float, statement_timeout: float) -> str:
    """The node's DSN plus what lagwatch always sets; the password is added only here."""
    params = psycopg.conninfo.conninfo_to_dict(node.dsn)
    options = str(params.get("options", ""))
    extra: dict[str, Any] = {
        "application_name": "lagwatch",
        # libpq's connect_timeout is whole seconds, minimum 2; the client-side deadline
        # in NodePoller is the real budget.
        "connect_timeout": max(2, round(connect_timeout)),
        "options": f"{options} -c statement_timeout={max(1, int(statement_timeout * 1000))}".strip(),
    }
    password = node.password()
    if password is not None:
        extra["password"] = password
    return psycopg.conninfo.make_conninfo(node.dsn, **extra)
