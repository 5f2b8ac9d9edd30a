"""Subscriptions on a primary lagwatch watches (it is then a subscriber): each one's apply
worker from ``pg_stat_subscription`` (running or not; when it last heard from its
publisher, how far it has received and confirmed) and its errors from
``pg_stat_subscription_stats`` (15+: apply and table-sync errors; 18+: conflicts by type).

Read on one poll in ``SLOW_EVERY`` on each connection (the first, then every tenth:
views/base.py), as the vacuum horizon's is: on the others it is not in the statement at all and
the poll carries what was read last; a primary with no subscription pays one look at the
empty ``pg_subscription`` every tenth poll. Every column read is granted to every role
(``pg_subscription`` hides only ``subconninfo``, which is not read). The leading primary's
are the cluster's (a replica has a copy of the catalog but no apply worker).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from lagwatch.fastinit import fast_init
from lagwatch.lsn import format_lsn, parse_lsn
from lagwatch.render import families as f
from lagwatch.render.html import dur, esc
from lagwatch.rooms.base import Cycle, KeepsNothing, Room
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

Subscriptions = tuple[Subscription, ...]


class SubscriptionsKeeper(KeepsNothing):
    """The leading primary's, as the poll read or carried them."""

    def update(self, readings: Mapping[str, Subscriptions], cycle: Cycle) -> Subscriptions | None:
        if cycle.primary is None:
            return None  # no node leads: nothing is known
        # A leader that answered without them (a standby cluster's leader, where the view does
        # not apply; a failed read, which lagwatch_view_up says) has none that apply.
        return cycle.leading(readings) or ()


# -- what it exports ------------------------------------------------------------------------
_SECTION = "Subscriptions (the primary subscribes)"
C, SUB = "cluster", "subscription"
ENABLED = f.gauge("lagwatch_subscription_enabled", "Subscriber side: 1 if the subscription is enabled on the primary "
                  "lagwatch watches (read one poll in ten)", C, SUB, section=_SECTION)
WORKER = f.gauge("lagwatch_subscription_worker_running", "1 if the subscription's apply worker runs "
                 "(pg_stat_subscription); 0 while it does not (disabled, or restarting after an error)", C, SUB,
                 section=_SECTION)
RECEIPT_AGE = f.gauge("lagwatch_subscription_last_message_age_seconds", "Seconds since the subscription's apply "
                      "worker last received a message from its publisher (data or keepalive)", C, SUB,
                      section=_SECTION)
REPORTED_AGE = f.gauge("lagwatch_subscription_last_reported_age_seconds", "Seconds since the publisher sent the "
                       "message whose position the worker last reported back (latest_end_time)", C, SUB,
                       section=_SECTION)
APPLY_ERRORS = f.counter("lagwatch_subscription_apply_errors", "Errors applying the subscription's changes "
                         "(pg_stat_subscription_stats, PostgreSQL 15+; since its statistics were reset)", C, SUB,
                         section=_SECTION)
SYNC_ERRORS = f.counter("lagwatch_subscription_sync_errors", "Errors copying a table's initial data for the "
                        "subscription (PostgreSQL 15+)", C, SUB, section=_SECTION)
CONFLICTS = f.counter("lagwatch_subscription_conflicts", "Conflicts applying the subscription's changes, by type "
                      "(insert_exists, update_missing, ...; PostgreSQL 18+)", C, SUB, "type", section=_SECTION)
FAMILIES = (ENABLED, WORKER, RECEIPT_AGE, REPORTED_AGE, APPLY_ERRORS, SYNC_ERRORS, CONFLICTS)


def export(cluster: str, subs: Subscriptions) -> None:
    for sub in subs:
        key = [cluster, sub.name]
        ENABLED.add(key, float(sub.enabled))
        WORKER.add(key, float(sub.worker))
        for spec, value in ((RECEIPT_AGE, sub.receipt_age), (REPORTED_AGE, sub.latest_end_age),
                            (APPLY_ERRORS, sub.apply_errors), (SYNC_ERRORS, sub.sync_errors)):
            if value is not None:
                spec.add(key, value)
        if sub.conflicts:
            CONFLICTS.make().add_metrics(key, sorted(sub.conflicts.items()))


# -- what it shows ----------------------------------------------------------------------------
def status(subs: Subscriptions | None) -> list[dict[str, Any]] | None:
    """/api/status's "subscriptions": the leading primary's, as last read (null: no node
    leads; [] none, or none read from it)."""
    if subs is None:
        return None
    return [{**asdict(s), "received_lsn": format_lsn(s.received_lsn), "latest_end_lsn": format_lsn(s.latest_end_lsn),
             "conflicts": dict(s.conflicts)} for s in subs]


def page(subs: Subscriptions | None) -> str:
    """Each subscription: its worker, when it last heard from its publisher, its errors."""
    if not subs:
        return ""
    items = []
    for s in subs:
        state = ("disabled" if not s.enabled else "applying" if s.worker else "no apply worker")
        heard = "" if s.receipt_age is None else f", heard from its publisher {esc(dur(s.receipt_age))} ago"
        errors = "" if not s.apply_errors else f", {s.apply_errors} apply errors"
        item = f"{esc(s.name)}: {state}{heard}{errors}"
        items.append(item if s.enabled and s.worker and not s.apply_errors else f'<span class="bad">{item}</span>')
    return f'<div class="meta subscriptions">subscriptions (this primary subscribes): {"; ".join(items)}</div>'


ROOM = Room(VIEW, FAMILIES, SubscriptionsKeeper, export, status, page)
