"""pg_wal's size: ``pg_ls_waldir()`` on the primary, the directory its slots and
``wal_keep_size`` make it keep.

Read on the primary alone (what replication keeps is the primary's), where the role may run
``pg_ls_waldir()`` (the probe asks once per connection; without the grant the view would
fail outright, so it does not apply, and the reader says once which grant is missing). Per
node: a cluster with two primaries (split brain) shows each one's directory. Slots with no
``max_slot_wal_keep_size`` limit are shown as their share of the leading primary's (the
slots come with the cycle: rooms/base.py's Cycle).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lagwatch.fastinit import fast_init
from lagwatch.render import families as f
from lagwatch.render.html import esc
from lagwatch.rooms.base import Cycle, Grant, KeepsNothing, Room
from lagwatch.views.base import Row, View

QUERIES = {
    130000: "SELECT coalesce(sum(size), 0)::float8 AS bytes, count(*)::int AS files FROM pg_ls_waldir()",
}

GRANTS = (Grant("wal_dir", "has_function_privilege('pg_ls_waldir()', 'EXECUTE')",
                "GRANT EXECUTE ON FUNCTION pg_ls_waldir() TO ROLE", reads="the size of pg_wal"),)


@fast_init
@dataclass(frozen=True)
class WalDir:
    bytes: int
    files: int


def parse(rows: Sequence[Row]) -> WalDir:
    (row,) = rows
    return WalDir(bytes=int(row["bytes"]), files=int(row["files"]))


NAME = "wal_dir"
# Every primary has a pg_wal; it is read where the probe found EXECUTE on pg_ls_waldir().
VIEW = View(NAME, frozenset({"primary"}), QUERIES, parse, needs=(GRANTS[0].name,))

@dataclass(frozen=True)
class WalDirs:
    by_node: Mapping[str, WalDir]  # the primaries that answered with it, in node order
    # What each slot with no max_slot_wal_keep_size limit retains of the leading primary's
    # pg_wal (0-1): a slot that will fill the disk shows here before it does.
    slot_shares: Mapping[str, float]


class WalDirKeeper(KeepsNothing):
    """Nothing kept across cycles: pg_wal's size is what the last poll read."""

    def update(self, readings: Mapping[str, WalDir], cycle: Cycle) -> WalDirs | None:
        if not readings:
            return None
        leading = cycle.leading(readings)
        shares = {} if leading is None or leading.bytes <= 0 else {
            s.name: min(1.0, s.retained_bytes / leading.bytes)
            for s in cycle.slots if s.safe_wal_size is None and s.retained_bytes is not None}
        return WalDirs(dict(sorted(readings.items())), shares)


# -- what it exports ------------------------------------------------------------------------
_SECTION = "WAL directory"
C, N = "cluster", "node"
BYTES = f.gauge("lagwatch_wal_directory_bytes", "Size of the primary's pg_wal directory (pg_ls_waldir())", C, N,
                section=_SECTION)
FILES = f.gauge("lagwatch_wal_directory_files", "Files in the primary's pg_wal directory", C, N, section=_SECTION)
SLOT_SHARE = f.gauge("lagwatch_slot_wal_dir_share", "WAL a slot with no max_slot_wal_keep_size limit retains, "
                     "as a share of the pg_wal directory (needs pg_ls_waldir())", C, "slot", section=_SECTION)
FAMILIES = (BYTES, FILES, SLOT_SHARE)


def export(cluster: str, dirs: WalDirs) -> None:
    for node, d in dirs.by_node.items():
        BYTES.add([cluster, node], d.bytes)
        FILES.add([cluster, node], d.files)
    for slot, share in sorted(dirs.slot_shares.items()):
        SLOT_SHARE.add([cluster, slot], share)


# -- what it shows ----------------------------------------------------------------------------
def status(dirs: WalDirs | None) -> list[dict[str, Any]] | None:
    """/api/status's "wal_dir": per primary that answered, its pg_wal (null: not read)."""
    if dirs is None:
        return None
    return [{"node": node, "bytes": d.bytes, "files": d.files} for node, d in dirs.by_node.items()]


def page(dirs: WalDirs | None) -> str:
    if not dirs:
        return ""
    items = ", ".join(f"{esc(node)} {d.bytes / (1 << 20):.0f} MiB in {d.files} files"
                      for node, d in dirs.by_node.items())
    return f'<div class="meta wal-dir">pg_wal: {items}</div>'


ROOM = Room(VIEW, FAMILIES, WalDirKeeper, export, status, page, grants=GRANTS)
