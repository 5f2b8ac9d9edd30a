"""What a node's poller reads each cycle on its connection, and how.

Every view the node's role reads that applies to the server (asked once per connection,
views/base.py) and is due this poll (its cadence, counted per connection), in one prepared
statement (views/combined.py) run over libpq directly (wire.py): one round trip, one value.
A view read one poll in N has its last value carried on the polls between (where it keeps
one), until the node fails to answer or the connection is new. Should a view fail (a grant taken
away), the views are read one by one that cycle to learn which, and that one rests for
VIEW_RETRY_SECONDS so it does not cost the others their one statement. The walsenders'
names are read once per walsender (views/replication.py). Which views were read is the
node's view health.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, NamedTuple, TypeVar, cast

import psycopg
import psycopg.errors
import pydantic_core

from lagwatch.errors import flat_message
from lagwatch.estimate.snapshot import Role
from lagwatch.read import wire
from lagwatch.rooms import ROOMS, missing_grants
from lagwatch.rooms import VIEWS as ROOM_VIEWS
from lagwatch.views import CYCLE_VIEWS
from lagwatch.views.base import View
from lagwatch.views.cadence import Cadence
from lagwatch.views.combined import combined_sql, parse_combined
from lagwatch.views.probe import Capabilities
from lagwatch.views.replication import NAMES_SQL, SenderNames

T = TypeVar("T")

log = logging.getLogger("lagwatch.read.poll")

# The views each role may read, in CYCLE_VIEWS' order, then the rooms' (lagwatch.rooms).
_ROLE_VIEWS: dict[Role, tuple[View[Any], ...]] = {
    role: tuple(v for v in (*CYCLE_VIEWS, *ROOM_VIEWS) if role in v.roles) for role in ("primary", "replica")}
# A view that failed (a grant missing, a function gone) is retried after this long.
VIEW_RETRY_SECONDS = 300
GRANT_HINTS = {
    "slots": ": pg_replication_slots is readable by every role; is the role's search_path odd?",
    "replication": ": pg_stat_replication's LSNs need GRANT pg_read_all_stats TO ROLE",
    "walinspect": ": pg_walinspect needs GRANT EXECUTE ON FUNCTION pg_get_wal_stats(pg_lsn, pg_lsn, boolean) TO ROLE",
    "walinspect_blocks": ": WAL compression savings need GRANT EXECUTE ON FUNCTION "
                         "pg_get_wal_block_info(pg_lsn, pg_lsn, boolean) TO ROLE",
    "wal_receiver": ": pg_stat_wal_receiver shows its columns only to GRANT pg_read_all_stats TO ROLE",
    "wal_dating": ": staleness dated from the WAL needs GRANT EXECUTE ON FUNCTION "
                  "pg_get_wal_records_info(pg_lsn, pg_lsn) TO ROLE",
    "recovery": ": the startup process's wait is shown to GRANT pg_read_all_stats TO ROLE",
    "heartbeat": ": the heartbeat table needs GRANT SELECT ON it TO ROLE (deploy/sql/lagwatch-heartbeat.sql)",
}
# A room's view needs its room's grants (lagwatch.rooms).
GRANT_HINTS.update({room.name: ": needs " + "; ".join(g.statement for g in room.grants)
                    for room in ROOMS if room.grants})


def for_role(hint: str, user: str | None) -> str:
    """A grant hint with the role lagwatch logs in as (``GRANT ... TO lagwatch``)."""
    return hint.replace("TO ROLE", f"TO {user}" if user else "TO lagwatch's role")


class ViewsRead(NamedTuple):
    results: dict[str, Any]  # view -> what it parsed to (read it with ``of``, typed)
    health: dict[str, bool]  # view -> read this cycle (the views that apply to the node's role)
    failed: dict[str, str]  # view -> why it could not be read this cycle

    def of(self, view: View[T]) -> T | None:
        """What ``view`` parsed to this cycle, as its parser types it (None: not read). The
        one place a result leaves the dictionary untyped: every caller gets the view's type,
        so mypy follows each value from the parser to the observation."""
        return cast("T | None", self.results.get(view.name))


class ViewReader:
    def __init__(self, where: str, extra: Sequence[View[Any]] = ()) -> None:
        self.where = where  # "cluster/node", for the log
        # The role's views, and the cluster's own (the heartbeat row) where they apply.
        self._role_views = {role: views + tuple(v for v in extra if role in v.roles)
                            for role, views in _ROLE_VIEWS.items()}
        self._names = [v.name for v in (*CYCLE_VIEWS, *ROOM_VIEWS, *extra)]
        self._cadence = Cadence()  # the views read one poll in N: what the polls between carry
        self.resting: dict[str, float] = {}  # view -> monotonic time it is tried again
        self.view_errors: dict[str, int] = {}  # view -> failed reads since start
        self.user: str | None = None  # the role the connection logs in as, for grant hints
        self._said: set[str] = set()  # what say_skipped has said
        self._denied: set[str] = set()  # views whose grant, found by the probe, was refused this poll
        self.probe_again = False  # the poller probes the connection again before its next poll
        self.new_connection(None)

    def say_skipped(self, caps: Capabilities, walinspect: str) -> None:
        """What the connection cannot read, and the grant that would let it: said once per
        reader, from the probe (its own views') and the rooms (theirs, where they apply)."""
        lines = [(logging.WARNING, f"not reading {view}: {for_role(why, self.user)}")
                 for view, why in caps.skipped.items()]
        lines += [(logging.WARNING, f"{room.name}: not reading {needed.reads or 'its view'}: "
                                    f"{for_role(needed.statement, self.user)}")
                  for room, needed in missing_grants(caps)]
        if caps.has_walinspect is False and walinspect == "auto" and not caps.in_recovery:
            lines.append((logging.INFO, "pg_walinspect is not installed; FPI byte statistics are off"))
        elif caps.has_walinspect and caps.major < 16 and walinspect == "auto" and not caps.in_recovery:
            lines.append((logging.INFO, f"PostgreSQL {caps.major} has no pg_get_wal_block_info (16+): WAL "
                                        "compression savings are not measured"))
        # Each said once per reader: a node promoted (probed again) says what now matters.
        for level, line in lines:
            if line not in self._said:
                self._said.add(line)
                log.log(level, "%s: %s", self.where, line)

    def new_connection(self, user: str | None) -> None:
        """A new session: nothing is prepared on it, no walsender named yet."""
        self.user = user
        self._prepared: dict[bytes, bytes] = {}  # combined statement -> its name on this connection
        # Names never reused on a connection: after a lost statement the others may still
        # be there, and preparing a name the session holds fails.
        self._prepare_count = 0
        self._senders = SenderNames()  # the names of the walsenders seen on this connection
        self._polls = 0  # polls read on this connection: the cadenced views' clock
        self._caps: Capabilities | None = None  # the probe's answer the views below were chosen by
        self._applying: tuple[View[Any], ...] = ()  # the role's views that apply to this server
        self._unreadable: frozenset[str] = frozenset()  # ... and those it may not read
        self._cadence.forget()

    def forget_kept(self) -> None:
        """The node did not answer: what was read of it before is not carried further."""
        self._cadence.forget()

    def is_resting(self, view: str) -> bool:
        return self.resting.get(view, 0.0) > time.monotonic()

    async def read(self, conn: psycopg.AsyncConnection[Any], caps: Capabilities) -> ViewsRead:
        """This cycle's views. Raises psycopg.OperationalError when the connection broke."""
        views = self._views(caps)
        poll, self._polls = self._polls, self._polls + 1
        try:
            results = await self._read_views(conn, caps, views)
            failed: dict[str, str] = {}
        except psycopg.OperationalError:
            raise
        except psycopg.Error:
            # One view failed and with it the statement: read them one by one to
            # learn which, so that the others still count this cycle.
            results, failed = await self._one_by_one(conn, caps, views)
        receiver = results.get("wal_receiver")
        if receiver is not None and receiver.hidden:
            # A receiver runs but its status is hidden: not "not streaming", but unknown.
            del results["wal_receiver"]
            failed["wal_receiver"] = "its columns are hidden from this role"
        for view, error in failed.items():
            self.note_failure(view, error, rest=view not in self._denied)
        if self._denied:
            # A grant the probe found, taken away since: the view's SQL (or whether it is
            # read) was chosen by it, so the next poll asks the server again (poll.py) and
            # chooses anew, rather than resting the view until a reconnect.
            self.probe_again, self._denied = True, set()
        health = {name: name in results for name in self._names if name in results or name in failed
                  or name in self.resting or name in caps.skipped or name in self._unreadable}
        self._cadence.carry(self._applying, poll, results, failed, health, self.is_resting)
        if "replication" not in results:
            # Unread (failed, resting, or a replica): the names go, so a pid the kernel hands
            # to another walsender before the view is read again is asked for afresh.
            self._senders.forget()
        return ViewsRead(results, health, failed)

    def _views(self, caps: Capabilities) -> Sequence[View[Any]]:
        """The views this poll reads: the role's that apply to the server (chosen once per
        probe), those read one poll in N only when due, none that rests after a failure."""
        if caps is not self._caps:
            self._caps = caps
            role_views = self._role_views["replica" if caps.in_recovery else "primary"]
            self._applying = tuple(v for v in role_views if v.readable(caps))
            # Views the server has but the role may not read (a room's grant missing): down.
            self._unreadable = frozenset(v.name for v in role_views if v.applies(caps) and not v.readable(caps))
        views = self._cadence.choose(self._applying, self._polls)
        if not self.resting:
            return views  # every cycle but after a failure: the same tuple, nothing to filter
        now = time.monotonic()
        return [v for v in views if self.resting.get(v.name, 0.0) <= now]

    async def _read_views(self, conn: psycopg.AsyncConnection[Any], caps: Capabilities,
                          views: Sequence[View[Any]]) -> dict[str, Any]:
        # Prepared once per connection and set of views; run over libpq directly rather
        # than through a cursor, which cost more than the rest of the poll.
        sql = combined_sql(views, caps)
        name = self._prepared.get(sql)
        try:
            if name is None:
                name = b"lagwatch_cycle_%d" % self._prepare_count
                self._prepare_count += 1
                await wire.prepare(conn, name, sql)
                self._prepared[sql] = name
            value = await wire.execute_prepared(conn, name)
        except psycopg.errors.InvalidSqlStatementName:
            self._prepared.clear()  # gone from the session (DISCARD ALL by a pooler?): prepared again next cycle
            raise
        assert value is not None
        # pydantic's JSON parser (jiter, a dependency already): 2.5 times json.loads's speed
        # on a primary's 2 kB, a tenth of a fleet daemon's CPU before.
        rows = pydantic_core.from_json(value)
        if "replication" in rows:
            rows["replication"] = await self._named_senders(conn, rows["replication"])
        return parse_combined(views, rows)

    async def _named_senders(self, conn: psycopg.AsyncConnection[Any],
                             rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The walsender rows with their names: a second statement only in a cycle that
        shows a walsender this connection has not seen (views/replication.py)."""
        missing = self._senders.missing(rows)
        if missing:
            cursor = await conn.execute(NAMES_SQL, (missing,))
            self._senders.learn(await cursor.fetchall())
        return self._senders.named(rows)

    async def _one_by_one(self, conn: psycopg.AsyncConnection[Any], caps: Capabilities,
                          views: Sequence[View[Any]]) -> tuple[dict[str, Any], dict[str, str]]:
        results, failed = {}, {}
        for view in views:
            sql = view.sql(caps)
            assert sql is not None
            try:
                cursor = await conn.execute(sql)
                rows = await cursor.fetchall()
                if view.name == "replication":
                    rows = await self._named_senders(conn, rows)
                results[view.name] = view.parse(rows)
            except psycopg.OperationalError:
                raise
            except psycopg.Error as exc:
                failed[view.name] = flat_message(exc)
                if isinstance(exc, psycopg.errors.InsufficientPrivilege) and (view.queries_for or view.needs):
                    self._denied.add(view.name)
        return results, failed

    def note_failure(self, view: str, error: str, rest: bool = True) -> None:
        """A view that failed: counted, and (but for the server view, whose failure is the
        node's) rested for VIEW_RETRY_SECONDS, with a WARNING that names the grant it needs;
        ``rest`` False: read again as the next probe chooses."""
        self.view_errors[view] = self.view_errors.get(view, 0) + 1
        if view == "server":
            return  # the node is down this cycle; nothing to rest
        if not rest:
            log.warning("%s: cannot read %s (%s)%s; asking the server again what this role may read", self.where,
                        view, error, for_role(GRANT_HINTS.get(view, ""), self.user))
            return
        self.resting[view] = time.monotonic() + VIEW_RETRY_SECONDS
        log.warning("%s: cannot read %s (%s)%s; the node stays up without it, retrying in %ds", self.where, view,
                    error, for_role(GRANT_HINTS.get(view, ""), self.user), VIEW_RETRY_SECONDS)
