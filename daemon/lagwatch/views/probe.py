"""What a connection can do, asked once per connection: version, role, privileges."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lagwatch.views.base import Row

_STATS_FN = "to_regprocedure('pg_get_wal_stats(pg_lsn,pg_lsn,boolean)')"

SQL = f"""SELECT current_setting('server_version_num')::int AS version_num,
    pg_is_in_recovery() AS in_recovery,
    has_function_privilege('pg_ls_waldir()', 'EXECUTE') AS can_ls_waldir,
    {_STATS_FN} IS NOT NULL AS has_walinspect,
    CASE WHEN {_STATS_FN} IS NOT NULL
         THEN has_function_privilege({_STATS_FN}, 'EXECUTE') END AS can_walinspect,
    pg_has_role('pg_read_all_stats', 'USAGE') AS can_read_all_stats"""


@dataclass(frozen=True)
class Capabilities:
    version_num: int
    in_recovery: bool
    can_ls_waldir: bool
    has_walinspect: bool
    can_walinspect: bool
    can_read_all_stats: bool

    @property
    def major(self) -> int:
        return self.version_num // 10000

    def skipped(self) -> dict[str, str]:
        """What this connection cannot read, and why: said once in the log."""
        out = {}
        if not self.can_ls_waldir:
            out["wal_dir"] = "no EXECUTE on pg_ls_waldir() (grant pg_monitor)"
        if not self.can_read_all_stats:
            out["replication"] = "not a member of pg_read_all_stats: LSN columns are hidden (grant pg_monitor)"
        if self.has_walinspect and not self.can_walinspect and not self.in_recovery:  # used on the primary only
            out["walinspect"] = "no EXECUTE on pg_get_wal_stats (grant pg_read_server_files)"
        return out


def parse(rows: Sequence[Row]) -> Capabilities:
    (row,) = rows
    return Capabilities(
        version_num=int(row["version_num"]),
        in_recovery=bool(row["in_recovery"]),
        can_ls_waldir=bool(row["can_ls_waldir"]),
        has_walinspect=bool(row["has_walinspect"]),
        can_walinspect=bool(row["can_walinspect"]),
        can_read_all_stats=bool(row["can_read_all_stats"]),
    )
