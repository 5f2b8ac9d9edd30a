"""WAL generation on the primary: pg_stat_wal counters and the settings that shape WAL."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lagwatch.fastinit import fast_init
from lagwatch.views.base import Row, View, opt_int

_SETTINGS = """current_setting('wal_compression') AS wal_compression,
    pg_size_bytes(current_setting('max_slot_wal_keep_size'))::float8 AS max_slot_wal_keep_bytes"""

QUERIES = {
    # No pg_stat_wal before 14: settings only.
    130000: f"""SELECT {_SETTINGS}, NULL::float8 AS wal_records, NULL::float8 AS wal_fpi,
    NULL::float8 AS wal_bytes, NULL::float8 AS wal_buffers_full, NULL::float8 AS wal_write,
    NULL::float8 AS wal_sync""",
    140000: f"""SELECT {_SETTINGS}, wal_records::float8, wal_fpi::float8, wal_bytes::float8,
    wal_buffers_full::float8, wal_write::float8, wal_sync::float8
FROM pg_stat_wal""",
    # 18 moved the write/sync counters to pg_stat_io.
    180000: f"""SELECT {_SETTINGS}, wal_records::float8, wal_fpi::float8, wal_bytes::float8,
    wal_buffers_full::float8, NULL::float8 AS wal_write, NULL::float8 AS wal_sync
FROM pg_stat_wal""",
}


def compression_method(setting: str) -> str:
    """Before 15 wal_compression is a boolean and 'on' means pglz; 15+ names the method."""
    value = setting.strip().lower()
    if value in ("on", "true", "yes", "1"):
        return "pglz"
    if value in ("off", "false", "no", "0"):
        return "off"
    return value


@fast_init
@dataclass(frozen=True)
class WalStats:
    compression: str  # off | pglz | lz4 | zstd
    max_slot_wal_keep_bytes: int | None  # None: unlimited (-1)
    records: int | None  # pg_stat_wal counters (14+), cumulative since stats reset
    fpi: int | None
    bytes: int | None
    buffers_full: int | None
    writes: int | None  # 14-17 only
    syncs: int | None


def parse(rows: Sequence[Row]) -> WalStats:
    (row,) = rows
    keep = opt_int(row["max_slot_wal_keep_bytes"])
    return WalStats(
        compression=compression_method(row["wal_compression"]),
        max_slot_wal_keep_bytes=None if keep is None or keep < 0 else keep,
        records=opt_int(row["wal_records"]),
        fpi=opt_int(row["wal_fpi"]),
        bytes=opt_int(row["wal_bytes"]),
        buffers_full=opt_int(row["wal_buffers_full"]),
        writes=opt_int(row["wal_write"]),
        syncs=opt_int(row["wal_sync"]),
    )


VIEW = View("wal", frozenset({"primary"}), QUERIES, parse)


