"""Benchmark: what reading the vacuum horizon and the logical walsenders costs the primary's poll.

Starts a primary (and one replica, so the primary has a walsender and slots), with
``--sessions`` idle sessions on it, then runs the primary's per-cycle statement as lagwatch
does (prepared, one round trip), in arms rotated every round so drift falls on each alike:

- ``without``: the primary's views read every poll, none of those read one poll in ten
  (rooms/horizon.py, rooms/subscriptions.py);
- ``with``: all of them as lagwatch reads them: the slow ones on one poll in ten
  (views/cadence.py: the statement without them on the nine others);
- ``every``: the slow views as if they were read on every poll (what the cadence saves);
- ``before logical``: ``with``, but pg_stat_replication read as before logical consumers
  were (logical walsenders filtered out in SQL) and no subscriptions view: with no logical
  walsender on the primary, what reading logical replication adds to ``with``.

Per arm: the primary backend's CPU per poll (/proc) and the wall time per poll, the median
over rounds with the spread; ``without`` is the same-run reference. Every arm reads every
view and room that applies to the primary (since the rooms, WAL generation, pg_wal's size
and archiving too), so figures from before them are not comparable with these. It prints; it asserts
nothing.

    python3 bench/primarycost.py [--pg-major 18] [--sessions 200] [--polls 2000] [--rounds 5]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "daemon"))
sys.path.insert(0, str(ROOT / "bench"))

import psycopg  # noqa: E402
from lagwatch import rooms  # noqa: E402
from lagwatch.demo.binaries import find_binaries  # noqa: E402
from lagwatch.demo.cluster import LocalCluster  # noqa: E402
from lagwatch.rooms import horizon, subscriptions  # noqa: E402
from lagwatch.views import CYCLE_VIEWS, replication  # noqa: E402
from lagwatch.views.combined import combined_sql  # noqa: E402
from replicacost import cadenced, cost_arguments, print_table, probed, room_for, run_rotated  # noqa: E402

ARMS = ("without", "with", "every", "before logical")

# views/replication.py's query before logical consumers were read (git 539c7cb): the same
# functions, logical slots' walsenders left out in SQL.
BEFORE_LOGICAL = """SELECT w.pid, w.state, w.sync_state,
    w.sent_lsn::text AS sent_lsn, w.write_lsn::text AS write_lsn,
    w.flush_lsn::text AS flush_lsn, w.replay_lsn::text AS replay_lsn,
    pg_current_wal_lsn()::text AS current_lsn,
    extract(epoch FROM w.write_lag)::float8 AS write_lag,
    extract(epoch FROM w.flush_lag)::float8 AS flush_lag,
    extract(epoch FROM w.replay_lag)::float8 AS replay_lag,
    s.slot_name
FROM pg_stat_get_wal_senders() w
LEFT JOIN pg_replication_slots s ON s.active_pid = w.pid
WHERE w.state IS DISTINCT FROM 'backup' AND coalesce(s.slot_type, 'physical') = 'physical'
ORDER BY w.pid"""


def main() -> int:
    args = cost_arguments(__doc__)
    binaries = find_binaries(args.pg_major)
    with LocalCluster(binaries, replicas=1) as cluster:
        primary = cluster.primary
        room_for([cluster.replicas[0], primary], args.sessions)
        idle = [psycopg.connect(primary.dsn(), autocommit=True) for _ in range(args.sessions)]
        conns = {arm: psycopg.connect(primary.dsn(), autocommit=True) for arm in ARMS}
        caps = probed(conns["with"])
        version = caps.version_num
        views = [v for v in (*CYCLE_VIEWS, *rooms.VIEWS) if "primary" in v.roles and v.applies(caps)]
        assert horizon.VIEW in views and subscriptions.VIEW in views
        without = combined_sql([v for v in views if v.every == 1], caps)
        with_slow = cadenced(views, caps)
        every = combined_sql(views, caps)
        now_read = replication.VIEW.sql_for(version)
        assert now_read is not None and now_read.encode() in every
        before_logical = [sql.replace(now_read.encode(), BEFORE_LOGICAL.encode())
                          for sql in cadenced([v for v in views if v.name != subscriptions.VIEW.name], caps)]
        sqls: dict[str, bytes | list[bytes]] = {"without": without, "with": with_slow, "every": every,
                                                "before logical": before_logical}
        print(f"PostgreSQL {binaries.major}, a primary with {args.sessions} idle sessions and one replica; "
              f"{args.rounds} rounds of {args.polls} polls per arm, rotated; one round trip a cycle in every arm")
        print_table(run_rotated(conns, sqls, args.rounds, args.polls))
        for conn in [*idle, *conns.values()]:
            conn.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
