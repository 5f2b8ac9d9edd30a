"""The vacuum horizon on the primary: who holds back the oldest row versions VACUUM may
remove, in transactions (``age()``). A slot's xmin and catalog_xmin come with the slots
(views/slots.py); this reads the others: a replica's ``hot_standby_feedback`` through a
walsender without a slot (its ``backend_xmin``), the primary's own sessions, and prepared
transactions.

``pg_stat_activity`` builds a row for every session, so this is read on one poll in
``SLOW_EVERY`` on each connection (the first, then every tenth: views/base.py); on the
others it is not in the statement at all and the poll carries what was read last.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from lagwatch.fastinit import fast_init
from lagwatch.views.base import SLOW_EVERY, Row, View, opt_int

QUERIES = {
    130000: """SELECT json_build_object(
        'walsenders', coalesce(json_object_agg(application_name, xids) FILTER (WHERE backend_type = 'walsender'),
                               '{}'::json),
        'sessions', max(xids) FILTER (WHERE backend_type <> 'walsender'),
        'prepared', (SELECT max(age(transaction))::int8 FROM pg_prepared_xacts)) AS held
    FROM (SELECT backend_type, application_name, greatest(age(backend_xmin), age(backend_xid))::int8 AS xids
          FROM pg_stat_activity
          WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) AND pid <> pg_backend_pid()) a""",
}


@fast_init
@dataclass(frozen=True)
class Horizon:
    """What holds the primary's vacuum horizon besides its slots, in transactions."""

    walsenders: Mapping[str, int] = field(default_factory=dict)  # by application_name: hot_standby_feedback
    sessions: int | None = None  # the oldest of the primary's own sessions (snapshot or transaction)
    prepared: int | None = None  # the oldest prepared transaction


def parse(rows: Sequence[Row]) -> Horizon:
    held = (rows[0].get("held") if rows else None) or {}
    return Horizon({str(k): int(v) for k, v in (held.get("walsenders") or {}).items() if v is not None},
                   opt_int(held.get("sessions")), opt_int(held.get("prepared")))


VIEW = View("horizon", frozenset({"primary"}), QUERIES, parse, every=SLOW_EVERY)
