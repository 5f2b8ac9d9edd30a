"""What a connection can do, asked once per connection: version, role, privileges."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

from lagwatch.views.base import Row
from lagwatch.views.recovery import PROBE_COLUMN as STARTUP_PID

_STATS_FN = "to_regprocedure('pg_get_wal_stats(pg_lsn,pg_lsn,boolean)')"
_BLOCKS_FN = "to_regprocedure('pg_get_wal_block_info(pg_lsn,pg_lsn,boolean)')"  # 16+
_RECORDS_FN = "to_regprocedure('pg_get_wal_records_info(pg_lsn,pg_lsn)')"

# The grant each view needs, as deploy/sql/lagwatch-role.sql gives them (ROLE: the login).
GRANTS = {
    "replication": "GRANT pg_read_all_stats TO ROLE",
    "wal_receiver": "GRANT pg_read_all_stats TO ROLE",
    "walinspect": "GRANT EXECUTE ON FUNCTION pg_get_wal_stats(pg_lsn, pg_lsn, boolean) TO ROLE (optional)",
    "walinspect_blocks": "GRANT EXECUTE ON FUNCTION pg_get_wal_block_info(pg_lsn, pg_lsn, boolean) TO ROLE "
                         "(optional)",
    "wal_dating": "GRANT EXECUTE ON FUNCTION pg_get_wal_records_info(pg_lsn, pg_lsn) TO ROLE (optional)",
    "recovery": "GRANT pg_read_all_stats TO ROLE",
}

SQL = f"""SELECT current_setting('server_version_num')::int AS version_num,
    pg_is_in_recovery() AS in_recovery,
    {_STATS_FN} IS NOT NULL AS has_walinspect,
    CASE WHEN {_STATS_FN} IS NOT NULL
         THEN has_function_privilege({_STATS_FN}, 'EXECUTE') END AS can_walinspect,
    coalesce({_BLOCKS_FN} IS NOT NULL AND has_function_privilege({_BLOCKS_FN}, 'EXECUTE'), false)
        AS can_walinspect_blocks,
    coalesce({_RECORDS_FN} IS NOT NULL AND has_function_privilege({_RECORDS_FN}, 'EXECUTE'), false)
        AS can_walinspect_records,
    pg_has_role('pg_read_all_stats', 'USAGE') AS can_read_all_stats,
    pg_has_role('pg_read_all_settings', 'USAGE') AS can_read_all_settings,
    -- (a replica's startup process, kept in the session for the recovery view)
    {STARTUP_PID}"""


@dataclass(frozen=True)
class Capabilities:
    version_num: int
    in_recovery: bool
    has_walinspect: bool
    can_walinspect: bool
    can_read_all_stats: bool
    can_read_all_settings: bool = False  # more than lagwatch needs: primary_conninfo shows passwords
    can_walinspect_blocks: bool = False  # pg_get_wal_block_info (16+): what WAL compression saves
    can_walinspect_records: bool = False  # pg_get_wal_records_info: staleness dated from commits
    # What the rooms asked of the connection (rooms/base.py: their probe columns and grants), by column.
    asked: Mapping[str, Any] = field(default_factory=dict)

    @property
    def major(self) -> int:
        return self.version_num // 10000

    @cached_property
    def skipped(self) -> dict[str, str]:
        """What this connection cannot read, and why: said once in the log (worked out once
        per connection, as every poll asks; read it, never change it)."""
        out = {}
        if not self.can_read_all_stats:
            out["replication"] = f"not a member of pg_read_all_stats: LSN columns are hidden ({GRANTS['replication']})"
            if self.in_recovery:
                out["recovery"] = ("not a member of pg_read_all_stats: what holds replay back is not read "
                                   f"({GRANTS['recovery']})")
        if self.has_walinspect and not self.can_walinspect and not self.in_recovery:  # used on the primary only
            out["walinspect"] = f"no EXECUTE on pg_get_wal_stats ({GRANTS['walinspect']})"
        elif self.has_walinspect and not self.can_walinspect_blocks and not self.in_recovery and self.major >= 16:
            out["walinspect_blocks"] = ("WAL compression savings are not measured: no EXECUTE on "
                                        f"pg_get_wal_block_info ({GRANTS['walinspect_blocks']})")
        if self.has_walinspect and self.can_walinspect and not self.can_walinspect_records and not self.in_recovery:
            out["wal_dating"] = ("staleness is not dated from the WAL's commits: no EXECUTE on "
                                 f"pg_get_wal_records_info ({GRANTS['wal_dating']})")
        return out


def sql(asked: Mapping[str, str]) -> str:
    """The probe, with the columns the rooms ask for once per connection (column -> SQL)."""
    return SQL + "".join(f",\n    {expr} AS {column}" for column, expr in asked.items())


_OWN = frozenset(f.name for f in fields(Capabilities)) | {"startup_pid"}


def parse(rows: Sequence[Row]) -> Capabilities:
    (row,) = rows
    return Capabilities(
        asked={k: v for k, v in row.items() if k not in _OWN},
        version_num=int(row["version_num"]),
        in_recovery=bool(row["in_recovery"]),
        has_walinspect=bool(row["has_walinspect"]),
        can_walinspect=bool(row["can_walinspect"]),
        can_read_all_stats=bool(row["can_read_all_stats"]),
        can_read_all_settings=bool(row.get("can_read_all_settings")),
        can_walinspect_blocks=bool(row.get("can_walinspect_blocks")),
        can_walinspect_records=bool(row.get("can_walinspect_records")),
    )
