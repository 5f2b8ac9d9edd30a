"""FPI bytes in the WAL written since the last cycle, from pg_walinspect's pg_get_wal_stats.

At most ``max_bytes`` of WAL are read per cycle so that a burst cannot make a poll slow;
what lies beyond is skipped and counted, and the next cycle starts at the current LSN.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from lagwatch.lsn import format_lsn, parse_lsn
from lagwatch.views.base import Row

# The range is [start, least(flush, start + max_bytes)); the caller only asks when the
# primary was seen past ``start`` (pg_get_wal_stats rejects an empty range).
_STATS = """SELECT b.s::text AS start_lsn, b.e::text AS end_lsn, b.cur::text AS flush_lsn,
    coalesce(sum(w.count), 0)::float8 AS records,
    coalesce(sum(w.record_size), 0)::float8 AS record_bytes,
    coalesce(sum(w.fpi_size), 0)::float8 AS fpi_bytes
FROM (SELECT '@start'::pg_lsn AS s, pg_current_wal_flush_lsn() AS cur,
             least(pg_current_wal_flush_lsn(), '@start'::pg_lsn + @max_bytes::numeric) AS e) b
LEFT JOIN LATERAL pg_get_wal_stats(b.s, b.e, false) w ON true
GROUP BY b.s, b.e, b.cur"""


def _limited(sql: str, timeout_ms: int) -> bytes:
    """``sql`` with a statement timeout of its own (``SET LOCAL`` in the same simple query:
    one round trip): a read of many megabytes on a busy primary is cancelled by the server
    at its budget rather than making the poll late. Literals only (LSNs and numbers)."""
    return f"SET LOCAL statement_timeout = {max(1, int(timeout_ms))}; {sql}".encode()


def statement(start: int, max_bytes: int, timeout_ms: int) -> bytes:
    return _limited(_STATS.replace("@start", str(format_lsn(start))).replace("@max_bytes", str(int(max_bytes))),
                    timeout_ms)


# What WAL compression saved in the same range (16+): per method, the full-page images
# stored compressed, their stored bytes, and their bytes uncompressed. The uncompressed size
# of an image is the page less its hole, the free space between pd_lower and pd_upper that
# PostgreSQL leaves out of a standard page's image (read from the restored page's header).
BLOCKS_SQL = """SELECT k.method, count(*)::float8 AS images, sum(k.stored)::float8 AS stored_bytes,
    sum(k.raw)::float8 AS raw_bytes
FROM (SELECT i.block_fpi_length AS stored,
             CASE WHEN 'COMPRESS_PGLZ' = ANY(i.block_fpi_info) THEN 'pglz'
                  WHEN 'COMPRESS_LZ4' = ANY(i.block_fpi_info) THEN 'lz4'
                  WHEN 'COMPRESS_ZSTD' = ANY(i.block_fpi_info) THEN 'zstd' END AS method,
             current_setting('block_size')::int - CASE WHEN 'HAS_HOLE' = ANY(i.block_fpi_info) THEN
                 (get_byte(i.block_fpi_data, 14) + 256 * get_byte(i.block_fpi_data, 15))
                 - (get_byte(i.block_fpi_data, 12) + 256 * get_byte(i.block_fpi_data, 13)) ELSE 0 END AS raw
      FROM pg_get_wal_block_info('@start'::pg_lsn, '@end'::pg_lsn, true) i
      WHERE i.block_fpi_length > 0) k
WHERE k.method IS NOT NULL
GROUP BY k.method"""


def blocks_statement(start: int, end: int, timeout_ms: int) -> bytes:
    sql = BLOCKS_SQL.replace("@start", str(format_lsn(start))).replace("@end", str(format_lsn(end)))
    return _limited(sql, timeout_ms)


@dataclass(frozen=True)
class Compressed:
    """Full-page images one compression method stored in the inspected WAL."""

    method: str  # pglz | lz4 | zstd
    images: int
    stored_bytes: int  # as written, compressed
    raw_bytes: int  # the same images uncompressed (page less its hole)

    @property
    def saved_bytes(self) -> int:
        return max(0, self.raw_bytes - self.stored_bytes)


def parse_blocks(rows: Sequence[Row]) -> tuple[Compressed, ...]:
    return tuple(Compressed(str(r["method"]), int(r["images"]), int(r["stored_bytes"]), int(r["raw_bytes"]))
                 for r in sorted(rows, key=lambda r: str(r["method"])))


@dataclass(frozen=True)
class WalInspection:
    start_lsn: int
    end_lsn: int
    flush_lsn: int
    records: int
    record_bytes: int
    fpi_bytes: int
    compressed: tuple[Compressed, ...] | None = None  # None: not measured (before 16, or no grant)

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


@dataclass(frozen=True)
class WalInspectTotals:
    """pg_walinspect counters since lagwatch started (bytes)."""

    inspected_bytes: int
    skipped_bytes: int
    fpi_bytes: int
    record_bytes: int
    last_interval_fpi_bytes: int
    last_interval_bytes: int
    # Compressed full-page images by method: (images, stored bytes, uncompressed bytes) since
    # start; empty until measured (pg_get_wal_block_info, 16+).
    compressed: dict[str, tuple[int, int, int]] = field(default_factory=dict)


class WalInspectTally:
    """A cluster's inspections added up since start (pure: each inspection in, the totals out)."""

    def __init__(self) -> None:
        self._totals = [0, 0, 0, 0]  # inspected, skipped, fpi, record bytes
        self._last = (0, 0)  # fpi and inspected bytes of the last inspection
        self._compressed: dict[str, tuple[int, int, int]] = {}  # method -> images, stored, raw bytes

    def add(self, inspection: WalInspection | None) -> WalInspectTotals | None:
        """The totals with ``inspection`` (None: none this cycle) added; None before any."""
        if inspection is not None:
            self._last = (inspection.fpi_bytes, inspection.inspected_bytes)
            for i, value in enumerate((inspection.inspected_bytes, inspection.skipped_bytes,
                                       inspection.fpi_bytes, inspection.record_bytes)):
                self._totals[i] += value
            for c in inspection.compressed or ():
                images, stored, raw = self._compressed.get(c.method, (0, 0, 0))
                self._compressed[c.method] = (images + c.images, stored + c.stored_bytes, raw + c.raw_bytes)
        elif not any(self._totals):
            return None
        inspected, skipped, fpi, record = self._totals
        return WalInspectTotals(inspected_bytes=inspected, skipped_bytes=skipped, fpi_bytes=fpi,
                                record_bytes=record, last_interval_fpi_bytes=self._last[0],
                                last_interval_bytes=self._last[1], compressed=dict(self._compressed))
