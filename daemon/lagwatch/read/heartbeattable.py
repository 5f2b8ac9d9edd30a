"""What the heartbeat table must be before lagwatch writes to it: exactly what
deploy/sql/lagwatch-heartbeat.sql makes, owned by a role lagwatch can trust.

The heartbeat is lagwatch's one write, and whatever code hangs on the table it writes
runs as lagwatch's role, which reads every session's query text (pg_read_all_stats): a
trigger, a rule, a CHECK constraint, an expression index, a generated column or a domain
type is a function call on each beat. So before its first beat on a session the writer
reads the table's shape from the catalogs and refuses any of them, and refuses a table
or a schema owned by a role that could add them later (the table's owner puts code on
it; the schema's owner can drop it and put another in its place). Trusted owners: a
superuser, the database's owner (``pg_database_owner`` too), or lagwatch's login itself.
Not every role the login is a member of: ``pg_has_role`` says a superuser is a member of
every role, and code a stranger puts on a table would then run as a superuser.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

SQL_FILE = "deploy/sql/lagwatch-heartbeat.sql"

# One statement, every name in it qualified (the session's search path is lagwatch's own,
# but the catalog reads should not depend on it either).
_TRUSTED = ("(SELECT r.rolsuper OR r.oid = d.datdba OR r.oid = pg_catalog.to_regrole('pg_database_owner') "
            "OR r.rolname = current_user "
            "FROM pg_catalog.pg_roles r, pg_catalog.pg_database d "
            "WHERE r.oid = {owner} AND d.datname = pg_catalog.current_database())")
SHAPE_SQL = f"""
SELECT c.relkind::text AS relkind, c.relrowsecurity AS row_security, n.nspname::text AS schema,
  pg_catalog.pg_get_userbyid(c.relowner)::text AS table_owner, {_TRUSTED.format(owner="c.relowner")} AS table_trusted,
  pg_catalog.pg_get_userbyid(n.nspowner)::text AS schema_owner, {_TRUSTED.format(owner="n.nspowner")} AS schema_trusted,
  (SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) FROM pg_catalog.pg_attribute a
    WHERE a.attrelid = c.oid AND a.attname = 'seq' AND NOT a.attisdropped) AS seq_type,
  (SELECT pg_catalog.array_agg(a.attname::text ORDER BY a.attnum) FROM pg_catalog.pg_attribute a
    WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
      AND NOT (a.attgenerated = '' AND (a.attname, a.atttypid) IN (
        ('id', 'pg_catalog.text'::pg_catalog.regtype), ('seq', 'pg_catalog.int8'::pg_catalog.regtype)))
  ) AS other_columns,
  (SELECT pg_catalog.array_agg(t.tgname::text ORDER BY t.tgname) FROM pg_catalog.pg_trigger t
    WHERE t.tgrelid = c.oid AND NOT t.tgisinternal) AS triggers,
  (SELECT pg_catalog.array_agg(w.rulename::text ORDER BY w.rulename) FROM pg_catalog.pg_rewrite w
    WHERE w.ev_class = c.oid) AS rules,
  (SELECT pg_catalog.array_agg(k.conname::text ORDER BY k.conname) FROM pg_catalog.pg_constraint k
    WHERE k.conrelid = c.oid AND k.contype NOT IN ('p', 'u', 'n')) AS constraints,
  (SELECT pg_catalog.array_agg(i.indexrelid::pg_catalog.regclass::text ORDER BY 1) FROM pg_catalog.pg_index i
    WHERE i.indrelid = c.oid AND (i.indexprs IS NOT NULL OR i.indpred IS NOT NULL)) AS indexes
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = %s::pg_catalog.regclass
""".encode()


class HeartbeatTableError(Exception):
    """The heartbeat table is not what deploy/sql/lagwatch-heartbeat.sql makes."""


def shape_problems(shape: dict[str, Any]) -> list[str]:
    """What is wrong with the table ``SHAPE_SQL`` read, each in a few words; [] when
    nothing is. Pure: the table test feeds it rows."""
    problems = []
    if shape["relkind"] != "r":
        problems.append(f"it is not a plain table (relkind {shape['relkind']!r})")
    if shape["seq_type"] != "bigint":
        found = "no seq column" if shape["seq_type"] is None else f"its seq column is {shape['seq_type']}"
        problems.append(f"{found}, not bigint")
    for kind, what in (("other_columns", "columns other than id text and seq bigint"), ("triggers", "triggers"),
                       ("rules", "rules"), ("constraints", "constraints other than its keys"),
                       ("indexes", "indexes on expressions or with predicates")):
        if shape[kind]:
            problems.append(f"{what}: {', '.join(shape[kind])}")
    if shape["row_security"]:
        problems.append("row security is on (its policies run as lagwatch's role)")
    if not shape["table_trusted"]:
        problems.append(f"it is owned by {shape['table_owner']}, who may put code on it")
    if not shape["schema_trusted"]:
        problems.append(f"its schema {shape['schema']} is owned by {shape['schema_owner']}, who may replace it")
    return problems


async def check_table(conn: psycopg.AsyncConnection[Any], table: str) -> None:
    """Raise HeartbeatTableError unless ``table`` is fit to beat in (see the module's
    docstring); a missing table raises psycopg's error, as the write would."""
    cursor = conn.cursor(row_factory=dict_row)
    await cursor.execute(SHAPE_SQL, (table,))
    shape = await cursor.fetchone()
    if shape is None:  # a regclass that resolved names a relation: not reached
        raise HeartbeatTableError("it is not in pg_class")
    problems = shape_problems(shape)
    if problems:
        raise HeartbeatTableError(f"{'; '.join(problems)}: lagwatch beats only in a table as {SQL_FILE} makes it, "
                                  "owned by a superuser or the database's owner (code on it would run as lagwatch)")
