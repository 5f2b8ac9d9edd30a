"""pg_stat_wal_receiver on a replica: is its WAL receiver streaming."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lagwatch.views.base import Row, View

QUERIES = {
    130000: "SELECT status FROM pg_stat_wal_receiver",
}


@dataclass(frozen=True)
class WalReceiver:
    status: str | None  # None: no WAL receiver running (cut off, or restarting)

    @property
    def streaming(self) -> bool:
        return self.status == "streaming"


def parse(rows: Sequence[Row]) -> WalReceiver:
    return WalReceiver(status=rows[0]["status"] if rows else None)


VIEW = View("wal_receiver", frozenset({"replica"}), QUERIES, parse)
