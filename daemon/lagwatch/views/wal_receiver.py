"""pg_stat_wal_receiver on a replica: is it streaming, from where, how recently heard from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lagwatch.lsn import parse_lsn
from lagwatch.views.base import Row, View, opt_float, opt_int

QUERIES = {
    130000: """SELECT status, sender_host, sender_port, slot_name,
    latest_end_lsn::text AS latest_end_lsn,
    extract(epoch FROM clock_timestamp() - last_msg_receipt_time)::float8 AS last_msg_age_seconds
FROM pg_stat_wal_receiver""",
}


@dataclass(frozen=True)
class WalReceiver:
    status: str | None  # None: no WAL receiver running (cut off, or restarting)
    sender_host: str | None = None
    sender_port: int | None = None
    slot_name: str | None = None
    latest_end_lsn: int | None = None
    last_msg_age_seconds: float | None = None

    @property
    def streaming(self) -> bool:
        return self.status == "streaming"


def parse(rows: Sequence[Row]) -> WalReceiver:
    if not rows:
        return WalReceiver(status=None)
    row = rows[0]
    return WalReceiver(
        status=row["status"],
        sender_host=row["sender_host"],
        sender_port=opt_int(row["sender_port"]),
        slot_name=row["slot_name"],
        latest_end_lsn=parse_lsn(row["latest_end_lsn"]),
        last_msg_age_seconds=opt_float(row["last_msg_age_seconds"]),
    )


VIEW = View("wal_receiver", frozenset({"replica"}), QUERIES, parse)
