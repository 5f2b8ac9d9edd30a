"""pg_stat_wal_receiver on a replica: is its WAL receiver streaming, and on which timeline."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lagwatch.fastinit import fast_init
from lagwatch.views.base import Row, View, opt_float, opt_int

QUERIES = {
    # pid is shown to every role; the other columns only with pg_read_all_stats.
    130000: """SELECT status, pid, received_tli,
    extract(epoch FROM clock_timestamp() - last_msg_receipt_time)::float8 AS last_msg_age
FROM pg_stat_wal_receiver""",
}


@fast_init
@dataclass(frozen=True)
class WalReceiver:
    status: str | None  # None: no WAL receiver running (cut off, or restarting), or hidden
    hidden: bool = False  # a receiver runs, but this role may not see its columns
    timeline: int | None = None  # the timeline it last received WAL on
    last_msg_age: float | None = None  # seconds since it last heard from the primary

    @property
    def streaming(self) -> bool:
        return self.status == "streaming"


def parse(rows: Sequence[Row]) -> WalReceiver:
    if not rows:
        return WalReceiver(status=None)
    row = rows[0]
    return WalReceiver(status=row["status"], hidden=row["status"] is None and row.get("pid") is not None,
                       timeline=opt_int(row.get("received_tli")), last_msg_age=opt_float(row.get("last_msg_age")))


VIEW = View("wal_receiver", frozenset({"replica"}), QUERIES, parse)
