"""WAL generation on the primary: pg_stat_wal's counters and the settings that shape WAL
(wal_compression, max_slot_wal_keep_size).

Read on the primary each poll (one row; pg_stat_wal is 14+, the settings only before). Per
node: after a failover the counters are another server's, and a series of its own says so
rather than a counter that jumps; a split brain shows both. The dashboards and rules take
``max by (cluster)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from lagwatch.fastinit import fast_init
from lagwatch.render import families as f
from lagwatch.render.html import esc
from lagwatch.rooms.base import ByNode, Room
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

WalByNode = Mapping[str, WalStats]  # the primaries that answered with it



# -- what it exports ------------------------------------------------------------------------
_SECTION = "WAL generation"
C, N = "cluster", "node"
COMPRESSION = f.gauge("lagwatch_wal_compression_info", "1 for the wal_compression method in use (off, pglz, lz4, "
                      "zstd)", C, N, "method", section=_SECTION)
MAX_SLOT_WAL_KEEP = f.gauge("lagwatch_max_slot_wal_keep_size_bytes", "max_slot_wal_keep_size setting (absent: "
                            "unlimited)", C, N, section=_SECTION)
BYTES = f.counter("lagwatch_wal_bytes", "WAL bytes generated (pg_stat_wal.wal_bytes)", C, N, section=_SECTION)
RECORDS = f.counter("lagwatch_wal_records", "WAL records generated (pg_stat_wal.wal_records)", C, N, section=_SECTION)
FPI = f.counter("lagwatch_wal_fpi", "Full-page images generated (pg_stat_wal.wal_fpi)", C, N, section=_SECTION)
BUFFERS_FULL = f.counter("lagwatch_wal_buffers_full", "Times WAL buffers were full (pg_stat_wal)", C, N,
                         section=_SECTION)
WRITES = f.counter("lagwatch_wal_writes", "WAL writes (pg_stat_wal, before PostgreSQL 18)", C, N, section=_SECTION)
SYNCS = f.counter("lagwatch_wal_syncs", "WAL syncs (pg_stat_wal, before PostgreSQL 18)", C, N, section=_SECTION)
FAMILIES = (COMPRESSION, MAX_SLOT_WAL_KEEP, BYTES, RECORDS, FPI, BUFFERS_FULL, WRITES, SYNCS)


def export(cluster: str, by_node: WalByNode) -> None:
    for node, w in by_node.items():
        key = [cluster, node]
        COMPRESSION.add([*key, w.compression], 1.0)
        if w.max_slot_wal_keep_bytes is not None:
            MAX_SLOT_WAL_KEEP.add(key, w.max_slot_wal_keep_bytes)
        for spec, value in ((BYTES, w.bytes), (RECORDS, w.records), (FPI, w.fpi), (BUFFERS_FULL, w.buffers_full),
                            (WRITES, w.writes), (SYNCS, w.syncs)):
            if value is not None:  # 13 has no pg_stat_wal, 18 no write/sync counters
                spec.add(key, value)


# -- what it shows ----------------------------------------------------------------------------
def status(by_node: WalByNode | None) -> list[dict[str, Any]] | None:
    """/api/status's "wal": per primary that answered, its pg_stat_wal and settings (null: not read)."""
    if by_node is None:
        return None
    return [{"node": node, **asdict(w)} for node, w in by_node.items()]


def page(by_node: WalByNode | None) -> str:
    if not by_node:
        return ""
    items = "; ".join(
        f"{esc(node)}: wal_compression {esc(w.compression)}, max_slot_wal_keep_size "
        + ("unlimited" if w.max_slot_wal_keep_bytes is None else f"{w.max_slot_wal_keep_bytes / (1 << 20):.0f} MiB")
        for node, w in by_node.items())
    return f'<div class="meta wal">WAL: {items}</div>'


ROOM = Room(VIEW, FAMILIES, ByNode, export, status, page)
