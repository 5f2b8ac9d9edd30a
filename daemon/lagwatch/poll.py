"""Talking to PostgreSQL: one long-lived connection per node, one round trip per cycle.

Each node has its own ``NodePoller``; ``poll_all`` runs them concurrently and gives every
node its own client-side deadline (session.py: counted in lagwatch's attention, so a
late lagwatch never closes a healthy session), so a hung host (whose server-side
``statement_timeout`` can never fire) delays nothing but its own answer. An answer not in
when the cycle stops waiting is judged (lateness.py): a silent node is down; an answer
lagwatch did not get to in time, or a first connection still under way, is no evidence.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

import psycopg
import psycopg.conninfo
import psycopg.errors
import pydantic_core
from psycopg.rows import dict_row

from lagwatch import wire
from lagwatch.config import ClusterConfig, Config, NodeConfig, PasswordUnavailableError
from lagwatch.conninfo import build_conninfo, connected_address, poller_application_name
from lagwatch.lateness import Verdict
from lagwatch.lsn import format_lsn
from lagwatch.redact import redact_text
from lagwatch.session import Outlasting, Session, SessionContext, reconnect_delay
from lagwatch.snapshot import ErrorKind, NodeObservation, Role
from lagwatch.views import CYCLE_VIEWS, probe, walinspect
from lagwatch.views.base import View
from lagwatch.views.combined import combined_sql, parse_combined
from lagwatch.views.probe import Capabilities
from lagwatch.views.replication import NAMES_SQL, SenderNames
from lagwatch.views.walinspect import WalInspection

log = logging.getLogger("lagwatch.poll")

MIN_VERSION_NUM = 130000
# pg_walinspect's FPI statistics are read at most this often (seconds).
WALINSPECT_EVERY = 10.0
# Bytes, as the combined statement (views/combined.py): psycopg keeps every statement it
# has run in the connection's prepare counts, and would encode a str into a copy of its own.
_PROBE_SQL = probe.SQL.encode()
# The views each role reads every cycle, in CYCLE_VIEWS' order.
_ROLE_VIEWS: dict[Role, tuple[View[Any], ...]] = {
    role: tuple(v for v in CYCLE_VIEWS if role in v.roles) for role in ("primary", "replica")}
# A view that failed (a grant missing, a function gone) is retried after this long.
VIEW_RETRY_SECONDS = 300
_GRANT_HINTS = {
    "wal_dir": ": pg_ls_waldir() needs GRANT EXECUTE ON FUNCTION pg_ls_waldir() TO ROLE",
    "slots": ": pg_replication_slots is readable by every role; is the role's search_path odd?",
    "replication": ": pg_stat_replication's LSNs need GRANT pg_read_all_stats TO ROLE",
    "walinspect": ": pg_walinspect needs GRANT EXECUTE ON FUNCTION pg_get_wal_stats(pg_lsn, pg_lsn, boolean) TO ROLE",
    "walinspect_blocks": ": WAL compression savings need GRANT EXECUTE ON FUNCTION "
                         "pg_get_wal_block_info(pg_lsn, pg_lsn, boolean) TO ROLE",
    "wal": ": pg_stat_wal needs PostgreSQL 14+",
    "wal_receiver": ": pg_stat_wal_receiver shows its columns only to GRANT pg_read_all_stats TO ROLE",
}


class NodeError(Exception):
    def __init__(self, kind: ErrorKind, message: str, backing_off: bool = False) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.backing_off = backing_off  # skipped this cycle: not a new failure


class NodePoller:
    """Polls one node. Keeps its connection, its capabilities and its reconnect backoff."""

    def __init__(self, cluster: ClusterConfig, node: str, role: Role, node_config: NodeConfig,
                 config: Config, context: SessionContext | None = None) -> None:
        self.cluster = cluster
        self.node = node
        self.role = role
        self.node_config = node_config
        self.interval = config.interval
        self.connect_timeout = config.effective_connect_timeout
        self.query_timeout = config.effective_query_timeout
        self.backoff_max = config.reconnect_backoff_max
        self._session = Session(context or SessionContext())
        self._caps: Capabilities | None = None
        self._prepared: dict[bytes, bytes] = {}  # combined statement -> its name on this connection
        # Names never reused on a connection: after a lost statement the others may still
        # be there, and preparing a name the session holds fails.
        self._prepare_count = 0
        self._senders = SenderNames()  # the names of the walsenders seen on this connection
        self._failures = 0
        self._next_attempt = 0.0
        self._connects = 0  # connection attempts since start: a reconnect storm would show here
        self._evidence = False  # a poll's outcome (an answer or a failure) was taken since this poller began
        self._walinspect_from: int | None = None
        self._walinspect_due = 0.0  # monotonic time of the next WAL inspection
        self._walinspected_at = time.monotonic()
        self._walinspect_failures = 0
        self._last_error = ""
        self._said_skipped = False
        self._resting: dict[str, float] = {}  # view -> monotonic time it is tried again
        self._view_errors: dict[str, int] = {}  # view -> failed reads since start
        self._walinspect_state: bool | None = None  # whether the last WAL inspection worked
        self._poll: Outlasting[NodeObservation] = Outlasting()  # the poll under way (poll_all)

    @property
    def _conn(self) -> psycopg.AsyncConnection[dict[str, Any]] | None:
        return self._session.conn

    def connected_address(self) -> tuple[str, int] | None:
        return connected_address(self._conn)

    def start(self) -> asyncio.Future[NodeObservation]:
        """This cycle's poll: one still running from an earlier cycle, one that finished
        after its cycle stopped waiting (its answer is used now), or a new one."""
        return self._poll.start(self.poll)

    def take(self, poll: asyncio.Future[NodeObservation]) -> NodeObservation:
        """The answer of a finished poll from ``start``: evidence about the node, whether
        it answered or failed."""
        self._evidence = True
        return self._poll.take(poll)

    def judge(self, now: float, budget: float) -> Verdict:
        """Why this node's poll, still under way, has not answered within the cycle's budget."""
        return self._session.judge(now, budget, first_connection=not self._evidence)

    def expire_overdue(self, now: float) -> None:
        """End the statement or connection attempt under way if it has had its whole
        deadline of lagwatch's attention and no answer waits for it (session.py)."""
        if self._session.expire_overdue(now):
            self._caps = None

    def unanswered(self, waited: float, verdict: Verdict) -> NodeObservation:
        """What a cycle reports for a node whose poll is still under way: down if it was
        silent; no evidence either way if lagwatch was late or it is still connecting."""
        now = time.monotonic()
        if verdict == "silent":
            return NodeObservation(cluster=self.cluster.name, node=self.node, role=self.role, observed_at=now,
                                   duration=waited, capabilities=self._caps, error_kind="timeout",
                                   connects_total=self._connects,
                                   error=f"no answer within the cycle's {waited:.3g}s (still trying)")
        return NodeObservation(cluster=self.cluster.name, node=self.node, role=self.role, observed_at=now,
                               duration=waited, capabilities=self._caps, connects_total=self._connects,
                               pending=verdict)

    async def poll(self) -> NodeObservation:
        started = time.monotonic()
        try:
            fields = await self._poll_once()
        except NodeError as exc:
            return self._failed(exc, started)
        except Exception as exc:  # a bug must not kill the cycle; it is logged with a trace
            log.exception("unexpected error polling %s/%s", self.cluster.name, self.node)
            return self._failed(NodeError("query", f"internal error: {type(exc).__name__}"), started)
        self._failures = 0
        now = time.monotonic()
        return NodeObservation(cluster=self.cluster.name, node=self.node, role=self.role,
                               observed_at=now, duration=now - started, view_errors_total=dict(self._view_errors),
                               connects_total=self._connects, **fields)

    def _failed(self, error: NodeError, started: float) -> NodeObservation:
        kind = error.kind
        message = redact_text(str(error), [self._password_for_redaction()])
        if not error.backing_off:
            self._last_error = message
            self._failures += 1
            self._next_attempt = time.monotonic() + reconnect_delay(self._failures, self.interval, self.backoff_max)
        now = time.monotonic()
        return NodeObservation(cluster=self.cluster.name, node=self.node, role=self.role,
                               observed_at=now, duration=now - started, capabilities=self._caps,
                               connects_total=self._connects, error_kind=kind, error=message)

    def _password_for_redaction(self) -> str | None:
        try:
            return self.node_config.password()
        except PasswordUnavailableError:
            return None

    async def _poll_once(self) -> dict[str, Any]:
        conn = await self._connection()
        assert self._caps is not None
        asked_at = time.monotonic()
        try:
            fields = await self._session.ask(self._query(conn, self._caps), self.query_timeout)
        except TimeoutError:
            raise NodeError("timeout", f"no answer within {self.query_timeout:.3g}s") from None
        except psycopg.OperationalError as exc:
            await self._disconnect()
            raise NodeError("query", _one_line(exc)) from None
        except psycopg.Error as exc:
            # A failover can turn a query invalid for the role; probe again next cycle.
            self._caps = None
            raise NodeError("query", _one_line(exc)) from None
        fields["asked_at"] = asked_at
        position = fields["position"]
        if position.in_recovery != self._caps.in_recovery:
            # Promoted or demoted under us: an answer like any other (the tracker follows
            # roles as observed); the next cycle chooses the queries for the new role.
            self._caps = None
        return fields

    async def _connection(self) -> psycopg.AsyncConnection[dict[str, Any]]:
        if self._conn is not None and not self._conn.closed and self._caps is not None:
            return self._conn
        if self._conn is None or self._conn.closed:
            if time.monotonic() < self._next_attempt:
                raise NodeError("connect", f"waiting to reconnect after: {self._last_error}", backing_off=True)
            try:
                conninfo = build_conninfo(self.node_config, self.connect_timeout, self.query_timeout,
                                          poller_application_name(self.cluster.name, self.node))
            except PasswordUnavailableError as exc:
                raise NodeError("connect", str(exc)) from None
            self._connects += 1
            self._prepared, self._prepare_count, self._senders = {}, 0, SenderNames()
            try:
                await self._session.connect(conninfo, self.connect_timeout, autocommit=True, row_factory=dict_row)
            except TimeoutError:
                raise NodeError("connect", f"could not connect within {self.connect_timeout:.3g}s") from None
            except psycopg.Error as exc:
                raise NodeError("connect", _one_line(exc)) from None
        assert self._conn is not None
        try:
            caps = await self._session.ask(self._probe(self._conn), self.query_timeout)
        except (TimeoutError, psycopg.Error) as exc:
            await self._disconnect()
            raise NodeError("connect", f"probe failed: {_one_line(exc) or 'timeout'}") from None
        if caps.version_num < MIN_VERSION_NUM:
            await self._disconnect()
            raise NodeError("connect", f"PostgreSQL {caps.version_num} is not supported (13 or later)")
        self._caps = caps
        self._say_skipped(caps)
        return self._conn

    @staticmethod
    async def _probe(conn: psycopg.AsyncConnection[dict[str, Any]]) -> Capabilities:
        cursor = await conn.execute(_PROBE_SQL)
        return probe.parse(await cursor.fetchall())

    def _say_skipped(self, caps: Capabilities) -> None:
        if self._said_skipped:
            return
        self._said_skipped = True
        for view, why in caps.skipped.items():
            log.warning("%s/%s: not reading %s: %s", self.cluster.name, self.node, view, self._for_role(why))
        if caps.has_walinspect is False and self.cluster.walinspect == "auto" and not caps.in_recovery:
            log.info("%s/%s: pg_walinspect is not installed; FPI byte statistics are off",
                     self.cluster.name, self.node)
        elif caps.has_walinspect and caps.major < 16 and self.cluster.walinspect == "auto" and not caps.in_recovery:
            log.info("%s/%s: PostgreSQL %d has no pg_get_wal_block_info (16+): WAL compression savings are not "
                     "measured", self.cluster.name, self.node, caps.major)

    def _views(self, caps: Capabilities) -> Sequence[View[Any]]:
        views = _ROLE_VIEWS["replica" if caps.in_recovery else "primary"]
        if caps.can_ls_waldir and not self._resting:
            return views  # every cycle but in the cases below: the same tuple, nothing to filter
        # Without pg_read_all_stats the replication view still answers (LSNs are NULL);
        # pg_ls_waldir() would fail outright, so it is left out. A view that failed lately
        # rests (VIEW_RETRY_SECONDS) so it does not cost the others their one statement.
        now = time.monotonic()
        return [v for v in views if not (v.name == "wal_dir" and not caps.can_ls_waldir)
                and self._resting.get(v.name, 0.0) <= now]

    async def _query(self, conn: psycopg.AsyncConnection[dict[str, Any]], caps: Capabilities) -> dict[str, Any]:
        views = self._views(caps)
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
        self._note_view_failures(failed)
        if "replication" not in results:
            # Unread (failed, resting, or a replica): the names go, so a pid the kernel hands
            # to another walsender before the view is read again is asked for afresh.
            self._senders.forget()
        if "server" not in results:
            raise NodeError("query", failed.get("server", "no answer from the server view"))
        position = results["server"]
        view_health = {v.name: v.name in results for v in CYCLE_VIEWS if v.name in results or v.name in failed
                       or v.name in self._resting or v.name in caps.skipped}
        fields: dict[str, Any] = {
            "capabilities": caps,
            "position": position,
            "walsenders": results.get("replication", ()),
            "receiver": results.get("wal_receiver"),
            "slots": results.get("slots", ()),
            "wal": results.get("wal"),
            "wal_dir": results.get("wal_dir"),
            "walinspect": await self._inspect_wal(conn, caps, position.current_lsn),
        }
        if self._walinspect_state is not None:
            view_health["walinspect"] = self._walinspect_state
        fields["views"] = view_health
        return fields

    async def _read_views(self, conn: psycopg.AsyncConnection[dict[str, Any]], caps: Capabilities,
                         views: Sequence[View[Any]]) -> dict[str, Any]:
        # All views in one statement (views/combined.py): one round trip, one value,
        # prepared once per connection and set of views, run over libpq directly
        # (wire.py) rather than through a cursor, which cost more than the rest of the poll.
        sql = combined_sql(views, caps.version_num)
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

    async def _named_senders(self, conn: psycopg.AsyncConnection[dict[str, Any]],
                             rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The walsender rows with their names: a second statement only in a cycle that
        shows a walsender this connection has not seen (views/replication.py)."""
        missing = self._senders.missing(rows)
        if missing:
            cursor = await conn.execute(NAMES_SQL, (missing,))
            self._senders.learn(await cursor.fetchall())
        return self._senders.named(rows)

    async def _one_by_one(self, conn: psycopg.AsyncConnection[dict[str, Any]], caps: Capabilities,
                          views: Sequence[View[Any]]) -> tuple[dict[str, Any], dict[str, str]]:
        results, failed = {}, {}
        for view in views:
            sql = view.sql_for(caps.version_num)
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
                failed[view.name] = _one_line(exc)
        return results, failed

    def _note_view_failures(self, failed: dict[str, str]) -> None:
        now = time.monotonic()
        for name, error in failed.items():
            self._view_errors[name] = self._view_errors.get(name, 0) + 1
            if name == "server":
                continue  # the node is down this cycle; nothing to rest
            self._resting[name] = now + VIEW_RETRY_SECONDS
            log.warning("%s/%s: cannot read %s (%s)%s; the node stays up without it, retrying in %ds",
                        self.cluster.name, self.node, name, error, self._for_role(_GRANT_HINTS.get(name, "")),
                        VIEW_RETRY_SECONDS)

    def _for_role(self, hint: str) -> str:
        """A grant hint with the role lagwatch logs in as (``GRANT ... TO lagwatch``)."""
        user = self._conn.info.user if self._conn is not None and not self._conn.closed else None
        return hint.replace("TO ROLE", f"TO {user}" if user else "TO lagwatch's role")

    async def _inspect_wal(self, conn: psycopg.AsyncConnection[dict[str, Any]], caps: Capabilities,
                           current: int | None) -> WalInspection | None:
        """FPI statistics of the WAL since the last inspection: a second round trip, only on
        the primary's DSN, when pg_walinspect is usable and the primary has written
        something, at most every WALINSPECT_EVERY seconds (the counters add up the same;
        a fleet's primaries need not each pay two more statements a second). At most
        walinspect_max_bytes per cycle since the last inspection is read. Its failures
        are its own: they never mark the node down."""
        if self.cluster.walinspect == "off" or caps.in_recovery or not caps.has_walinspect or self.role != "primary":
            self._walinspect_state = None  # not a view of this node
            return None
        if not caps.can_walinspect or self._resting.get("walinspect", 0.0) > time.monotonic():
            self._walinspect_state = False
            return None
        if current is None or time.monotonic() < self._walinspect_due:
            return None
        start = self._walinspect_from
        if start is None or current <= start:
            self._walinspect_from = start if start is not None else current
            return None
        try:
            cycles = max(1, math.ceil((time.monotonic() - self._walinspected_at) / self.interval))
            cursor = await conn.execute(walinspect.SQL, {"start": format_lsn(start),
                                                         "max_bytes": self.cluster.walinspect_max_bytes * cycles})
            inspection = walinspect.parse(await cursor.fetchall())
        except psycopg.OperationalError:
            raise
        except psycopg.errors.InsufficientPrivilege as exc:
            self._walinspect_state = False
            self._note_view_failures({"walinspect": _one_line(exc)})
            return None
        except psycopg.Error as exc:
            # Typically no complete record yet after ``start`` (it may sit mid-record):
            # try the same start again, but jump to the present if it keeps failing.
            self._walinspect_failures += 1
            log.debug("%s/%s: pg_get_wal_stats from %s failed: %s", self.cluster.name, self.node,
                      format_lsn(start), _one_line(exc))
            if self._walinspect_failures >= 3:
                self._walinspect_from, self._walinspect_failures = current, 0
            return None
        self._walinspect_failures = 0
        self._walinspect_from = inspection.flush_lsn
        self._walinspected_at = time.monotonic()
        self._walinspect_due = self._walinspected_at + max(self.interval, WALINSPECT_EVERY) - self.interval / 2
        self._walinspect_state = True
        return await self._compression_saved(conn, caps, inspection)

    async def _compression_saved(self, conn: psycopg.AsyncConnection[dict[str, Any]], caps: Capabilities,
                                 inspection: WalInspection) -> WalInspection:
        """What WAL compression saved in the range just inspected (16+, with the grant):
        its failures leave the FPI statistics as they are."""
        if not caps.can_walinspect_blocks or inspection.end_lsn <= inspection.start_lsn \
                or self._resting.get("walinspect_blocks", 0.0) > time.monotonic():
            return inspection
        try:
            cursor = await conn.execute(walinspect.BLOCKS_SQL, {"start": format_lsn(inspection.start_lsn),
                                                                "end": format_lsn(inspection.end_lsn)})
            compressed = walinspect.parse_blocks(await cursor.fetchall())
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            self._note_view_failures({"walinspect_blocks": _one_line(exc)})
            return inspection
        return replace(inspection, compressed=compressed)

    async def close(self) -> None:
        await self._poll.cancel()
        await self._disconnect()

    async def _disconnect(self) -> None:
        """Close the connection (from within a poll: unlike ``close``, the poll goes on)."""
        self._caps = None
        await self._session.close()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def pollers_for(cluster: ClusterConfig, config: Config, context: SessionContext | None = None) -> list[NodePoller]:
    pollers = [NodePoller(cluster, "primary", "primary", cluster.primary, config, context)]
    pollers += [NodePoller(cluster, r.name, "replica", r, config, context) for r in cluster.replicas]
    return pollers


async def poll_all(pollers: Sequence[NodePoller], budget: float,
                   alongside: Collection[asyncio.Future[Any]] = ()) -> list[NodeObservation]:
    """Every node at once, waiting at most ``budget`` seconds (for ``alongside`` too, other
    work of the cycle that runs meanwhile). Each poller enforces its own deadlines and
    never raises; a node whose poll is still under way when the budget is spent is judged
    (lateness.judge_unanswered): down if it was silent, else no evidence this cycle; its
    poll goes on for a later cycle to take."""
    started = time.monotonic()
    polls = [p.start() for p in pollers]
    if polls or alongside:
        await asyncio.wait([*polls, *alongside], timeout=budget)
    now = time.monotonic()
    waited = now - started
    out = []
    for p, poll in zip(pollers, polls, strict=True):
        if poll.done():
            out.append(p.take(poll))
            continue
        p.expire_overdue(now)  # a hung host's statement: its socket closed, its poll ends soon
        out.append(p.unanswered(waited, p.judge(now, budget)))
    return out
