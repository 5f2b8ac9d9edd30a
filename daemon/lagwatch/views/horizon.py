"""The vacuum horizon on the primary: who holds back the oldest row versions VACUUM may
remove, in transactions (``age()``). A slot's xmin and catalog_xmin come with the slots
(views/slots.py); this reads the others: a replica's ``hot_standby_feedback`` through a
walsender without a slot (its ``backend_xmin``), the primary's own sessions, and prepared
transactions.

``pg_stat_activity`` builds a row for every session, so this is read on one poll in
``READS_EVERY`` on each connection (the first, then every tenth), counted in the session
as views/recovery.py counts its ``pg_stat_io`` reads; on the others it says it was not read
and the tracker keeps what it read last.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from lagwatch.fastinit import fast_init
from lagwatch.views.base import Row, View, opt_int

READS_EVERY = 10
_TICK_SETTING = "lagwatch.horizon_tick"

# On the nine polls in ten that do not read it, the statement is one set_config(): the
# CASE never reaches its subquery (bench/primarycost.py measures what is left).
QUERIES = {
    130000: f"""SELECT due, CASE WHEN due THEN (
    SELECT json_build_object(
        'walsenders', coalesce(json_object_agg(application_name, xids) FILTER (WHERE backend_type = 'walsender'),
                               '{{}}'::json),
        'sessions', max(xids) FILTER (WHERE backend_type <> 'walsender'),
        'prepared', (SELECT max(age(transaction))::int8 FROM pg_prepared_xacts))
    FROM (SELECT backend_type, application_name, greatest(age(backend_xmin), age(backend_xid))::int8 AS xids
          FROM pg_stat_activity
          WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) AND pid <> pg_backend_pid()) a) END AS held
FROM (SELECT set_config('{_TICK_SETTING}', ((coalesce(nullif(current_setting('{_TICK_SETTING}', true), ''), '0')::int
        % {READS_EVERY}) + 1)::text, false)::int = 1 AS due) tick""",
}


@fast_init
@dataclass(frozen=True)
class Horizon:
    """What holds the primary's vacuum horizon besides its slots, in transactions; None when
    this poll did not read it (one in ten does)."""

    walsenders: Mapping[str, int] = field(default_factory=dict)  # by application_name: hot_standby_feedback
    sessions: int | None = None  # the oldest of the primary's own sessions (snapshot or transaction)
    prepared: int | None = None  # the oldest prepared transaction


def parse(rows: Sequence[Row]) -> Horizon | None:
    if not rows or not rows[0].get("due"):
        return None
    held = rows[0].get("held") or {}
    return Horizon({str(k): int(v) for k, v in (held.get("walsenders") or {}).items() if v is not None},
                   opt_int(held.get("sessions")), opt_int(held.get("prepared")))


VIEW = View("horizon", frozenset({"primary"}), QUERIES, parse)
