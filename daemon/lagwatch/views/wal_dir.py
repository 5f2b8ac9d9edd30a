"""Size of pg_wal (pg_ls_waldir() needs EXECUTE on it; probed at connect)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lagwatch.fastinit import fast_init
from lagwatch.views.base import Row, View
from lagwatch.views.probe import Capabilities

QUERIES = {
    130000: "SELECT coalesce(sum(size), 0)::float8 AS bytes, count(*)::int AS files FROM pg_ls_waldir()",
}


@fast_init
@dataclass(frozen=True)
class WalDir:
    bytes: int
    files: int


def parse(rows: Sequence[Row]) -> WalDir:
    (row,) = rows
    return WalDir(bytes=int(row["bytes"]), files=int(row["files"]))


def applies(caps: Capabilities) -> bool:
    """pg_ls_waldir() without its grant would fail outright (probe.py says which grant)."""
    return caps.can_ls_waldir


# Read on the primary only: lagwatch exports the primary's pg_wal (what slots make it keep).
VIEW = View("wal_dir", frozenset({"primary"}), QUERIES, parse, applies=applies)
