"""Subscriptions on a primary lagwatch watches (it is then a subscriber): each one's apply
worker from ``pg_stat_subscription`` (running or not; when it last heard from its
publisher, how far it has received and confirmed) and its errors from
``pg_stat_subscription_stats`` (15+: apply and table-sync errors; 18+: conflicts by type).

Read on one poll in ``SLOW_EVERY`` on each connection (the first, then every tenth:
views/base.py), as views/horizon.py is: on the others it is not in the statement at all and
the poll carries what was read last; a primary with no subscription pays one look at the
empty ``pg_subscription`` every tenth poll. Every column read is granted to every role
(``pg_subscription`` hides only ``subconninfo``, which is not read).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from lagwatch.fastinit import fast_init
from lagwatch.lsn import parse_lsn
from lagwatch.views.base import SLOW_EVERY, Row, View, opt_float, opt_int

# 18's conflict counters, by the type lagwatch labels them with.
CONFLICTS_18 = ("insert_exists", "update_origin_differs", "update_exists", "update_missing",
                "delete_origin_differs", "delete_missing", "multiple_unique_conflicts")

_BASE = """SELECT (
    SELECT coalesce(json_agg(json_build_object(
        'name', s.subname, 'enabled', s.subenabled, 'worker', a.pid IS NOT NULL,
        'received_lsn', a.received_lsn::text, 'latest_end_lsn', a.latest_end_lsn::text,
        'send_age', extract(epoch FROM clock_timestamp() - a.last_msg_send_time)::float8,
        'receipt_age', extract(epoch FROM clock_timestamp() - a.last_msg_receipt_time)::float8,
        'latest_end_age', extract(epoch FROM clock_timestamp() - a.latest_end_time)::float8,
        'stats', {stats}) ORDER BY s.subname), '[]'::json)
    FROM pg_subscription s
    -- The subscription's apply worker: not a table-sync worker (relid) nor a parallel
    -- apply worker (16+: leader_pid).
    LEFT JOIN LATERAL (SELECT w.pid, w.received_lsn, w.latest_end_lsn, w.last_msg_send_time,
                              w.last_msg_receipt_time, w.latest_end_time
                       FROM pg_stat_subscription w
                       WHERE w.subid = s.oid AND w.pid IS NOT NULL AND w.relid IS NULL {apply_only}
                       LIMIT 1) a ON true
    {stats_join}) AS subscriptions"""

_STATS_JOIN = "LEFT JOIN pg_stat_subscription_stats st ON st.subid = s.oid"
_STATS_15 = "json_build_object('apply_errors', st.apply_error_count, 'sync_errors', st.sync_error_count)"
_STATS_18 = ("json_build_object('apply_errors', st.apply_error_count, 'sync_errors', st.sync_error_count, "
             + ", ".join(f"'{c}', st.confl_{c}" for c in CONFLICTS_18) + ")")


def _query(stats: str, stats_join: str, apply_only: str) -> str:
    return _BASE.format(stats=stats, stats_join=stats_join, apply_only=apply_only)


QUERIES = {
    # 13 and 14 keep no error counts (pg_stat_subscription_stats came in 15).
    130000: _query("NULL::json", "", ""),
    150000: _query(_STATS_15, _STATS_JOIN, ""),
    160000: _query(_STATS_15, _STATS_JOIN, "AND w.leader_pid IS NULL"),
    180000: _query(_STATS_18, _STATS_JOIN, "AND w.leader_pid IS NULL"),
}


@fast_init
@dataclass(frozen=True)
class Subscription:
    name: str
    enabled: bool
    worker: bool  # its apply worker runs
    received_lsn: int | None  # the publisher's WAL it has received
    latest_end_lsn: int | None  # the last position it reported to its publisher's walsender
    send_age: float | None  # seconds since its publisher sent the last message it received
    receipt_age: float | None  # seconds since it received it
    latest_end_age: float | None  # seconds since the publisher sent what latest_end_lsn is of
    apply_errors: int | None  # 15+: errors applying changes since the statistics were reset
    sync_errors: int | None  # 15+: errors copying a table's initial data
    conflicts: Mapping[str, int] = field(default_factory=dict)  # 18+: conflicts by type (CONFLICTS_18)


def parse(rows: Sequence[Row]) -> tuple[Subscription, ...]:
    """The subscriptions, by name."""
    out = []
    for sub in (rows[0].get("subscriptions") if rows else None) or ():
        stats = sub.get("stats") or {}
        out.append(Subscription(
            name=str(sub["name"]), enabled=bool(sub["enabled"]), worker=bool(sub["worker"]),
            received_lsn=parse_lsn(sub.get("received_lsn")), latest_end_lsn=parse_lsn(sub.get("latest_end_lsn")),
            send_age=opt_float(sub.get("send_age")), receipt_age=opt_float(sub.get("receipt_age")),
            latest_end_age=opt_float(sub.get("latest_end_age")), apply_errors=opt_int(stats.get("apply_errors")),
            sync_errors=opt_int(stats.get("sync_errors")),
            conflicts={c: int(stats[c]) for c in CONFLICTS_18 if stats.get(c) is not None}))
    return tuple(out)


VIEW = View("subscriptions", frozenset({"primary"}), QUERIES, parse, every=SLOW_EVERY)
