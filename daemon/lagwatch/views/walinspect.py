"""FPI bytes in the WAL written since the last cycle, from pg_walinspect's pg_get_wal_stats.

At most ``max_bytes`` of WAL are read per cycle so that a burst cannot make a poll slow;
what lies beyond is skipped and counted, and the next cycle starts at the current LSN.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lagwatch.lsn import parse_lsn
from lagwatch.views.base import Row

# The range is [start, least(flush, start + max_bytes)); the caller only asks when the
# primary was seen past ``start`` (pg_get_wal_stats rejects an empty range).
SQL = """SELECT b.s::text AS start_lsn, b.e::text AS end_lsn, b.cur::text AS flush_lsn,
    coalesce(sum(w.count), 0)::float8 AS records,
    coalesce(sum(w.record_size), 0)::float8 AS record_bytes,
    coalesce(sum(w.fpi_size), 0)::float8 AS fpi_bytes
FROM (SELECT %(start)s::pg_lsn AS s, pg_current_wal_flush_lsn() AS cur,
             least(pg_current_wal_flush_lsn(), %(start)s::pg_lsn + %(max_bytes)s::numeric) AS e) b
LEFT JOIN LATERAL pg_get_wal_stats(b.s, b.e, false) w ON true
GROUP BY b.s, b.e, b.cur"""


@dataclass(frozen=True)
class WalInspection:
    start_lsn: int
    end_lsn: int
    flush_lsn: int
    records: int
    record_bytes: int
    fpi_bytes: int

    @property
    def inspected_bytes(self) -> int:
        return self.end_lsn - self.start_lsn

    @property
    def skipped_bytes(self) -> int:
        return max(0, self.flush_lsn - self.end_lsn)


def parse(rows: Sequence[Row]) -> WalInspection:
    (row,) = rows
    start, end, flush = (parse_lsn(row[k]) for k in ("start_lsn", "end_lsn", "flush_lsn"))
    assert start is not None and end is not None and flush is not None
    return WalInspection(
        start_lsn=start,
        end_lsn=end,
        flush_lsn=flush,
        records=int(row["records"]),
        record_bytes=int(row["record_bytes"]),
        fpi_bytes=int(row["fpi_bytes"]),
    )
