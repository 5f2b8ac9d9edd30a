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
import time
from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

import psycopg
import psycopg.conninfo
import psycopg.errors
from psycopg.rows import dict_row

from lagwatch import rooms
from lagwatch.config import ClusterConfig, Config, NodeConfig, PasswordUnavailableError
from lagwatch.errors import flat_message
from lagwatch.estimate.lateness import Verdict
from lagwatch.estimate.snapshot import ErrorKind, NodeObservation, Role
from lagwatch.read.conninfo import build_conninfo, connected_address, poller_application_name
from lagwatch.read.extrareads import ExtraReads
from lagwatch.read.replayboard import ReplayBoard
from lagwatch.read.session import Outlasting, Session, SessionContext, reconnect_delay
from lagwatch.read.viewreader import ViewReader, ViewsRead
from lagwatch.redact import redact_text
from lagwatch.views import (
    heartbeat,
    probe,
    recovery,
    replication,
    server,
    startup_io,
    wal_receiver,
)
from lagwatch.views.probe import Capabilities
from lagwatch.views.replication import Senders

log = logging.getLogger("lagwatch.read.poll")

MIN_VERSION_NUM = 130000
# Bytes, as the combined statement (views/combined.py): psycopg keeps every statement it
# has run in the connection's prepare counts, and would encode a str into a copy of its own.
_PROBE_SQL = probe.sql(rooms.probe_columns()).encode()
# conflict_query_text, set in every replica session either way: a setting the role or the
# database carries (ALTER ROLE ... SET lagwatch.conflict_queries = 'on') is never inherited.
_QUERY_TEXT_SQL = {on: f"SELECT set_config('{recovery.QUERY_TEXT_SETTING}', '{'on' if on else 'off'}', false)".encode()
                   for on in (True, False)}


class NodeError(Exception):
    def __init__(self, kind: ErrorKind, message: str, backing_off: bool = False) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.backing_off = backing_off  # skipped this cycle: not a new failure


class _SlowError(Exception):
    """The node cancelled the poll's statement at its timeout: alive, slow (no evidence either way)."""


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
        self.cycle_budget = config.cycle_budget  # how long poll_all waits for this poll's answer
        self.conflict_query_text = config.conflict_query_text
        self.backoff_max = config.reconnect_backoff_max
        self._session = Session(context or SessionContext())
        self._caps: Capabilities | None = None
        beat = cluster.heartbeat
        self._beat_view = None if beat is None else heartbeat.view_for(beat.qualified_table(cluster.schemas),
                                                                           heartbeat.row_id(beat.id))
        self._reader = ViewReader(f"{cluster.name}/{node}", () if self._beat_view is None else (self._beat_view,))
        self._failures = 0
        self._next_attempt = 0.0
        self._connects = 0  # connection attempts since start: a reconnect storm would show here
        self._evidence = False  # a poll's outcome (an answer or a failure) was taken since this poller began
        self._answered = False  # the poll under way has had its node's answer (its extra reads may follow)
        # The primary's, after its answer (they take the cluster config in force per read).
        self._extras = ExtraReads(cluster.lag_from_wal_max_bytes, config.interval, self.query_timeout)
        self._last_error = ""
        self._poll: Outlasting[NodeObservation] = Outlasting()  # the poll under way (poll_all)

    @property
    def connection(self) -> psycopg.AsyncConnection[dict[str, Any]] | None:  # the node's session, if any
        return self._session.conn

    def connected_address(self) -> tuple[str, int] | None:
        return connected_address(self.connection)

    def start(self, board: ReplayBoard | None = None) -> asyncio.Future[NodeObservation]:
        """This cycle's poll: one still running from an earlier cycle, one that finished
        after its cycle stopped waiting (its answer is used now), or a new one, which
        shares ``board`` with the cluster's other polls of this cycle (replayboard.py)."""
        return self._poll.start(lambda: self.poll(board))

    def take(self, poll: asyncio.Future[NodeObservation]) -> NodeObservation:
        """The answer of a finished poll from ``start``: evidence about the node, whether
        it answered or failed."""
        self._evidence = True
        return self._poll.take(poll)

    def judge(self, now: float, budget: float) -> Verdict:
        """Why this node's poll, still under way, has not answered within the cycle's budget.
        Never silent once the node has answered this poll: what is under way then is one of
        lagwatch's own extra reads (pg_walinspect's), slow on a busy server, not a dead one."""
        if self._answered:
            return "late"
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

    async def poll(self, board: ReplayBoard | None = None) -> NodeObservation:
        """This node's answer; a replica's replay position goes on ``board`` as soon as it
        is known, for the primary's WAL read of the same cycle."""
        if board is None or self.role != "replica":
            return await self._observe(board)
        name = next((r.walsender_name for r in self.cluster.replicas if r.name == self.node), self.node)
        board.expect(name)
        observed = None
        try:
            observed = await self._observe(None)
            return observed
        finally:
            position = observed.position if observed is not None else None
            board.post(name, position.replay_lsn if position is not None and position.in_recovery else None)

    async def _observe(self, board: ReplayBoard | None) -> NodeObservation:
        started = time.monotonic()
        self._answered = False
        try:
            answer, asked_at = await self._poll_once(board, started + self.cycle_budget)
        except _SlowError as exc:
            log.debug("%s/%s: %s: read late this cycle", self.cluster.name, self.node, exc)
            return self.unanswered(time.monotonic() - started, "late")
        except NodeError as exc:
            return self._failed(exc, started)
        except Exception as exc:  # a bug must not kill the cycle; it is logged with a trace
            log.exception("unexpected error polling %s/%s", self.cluster.name, self.node)
            return self._failed(NodeError("query", f"internal error: {type(exc).__name__}"), started)
        self._failures = 0
        now = time.monotonic()
        # The answer is the observation already (what each view read, typed by its parser);
        # the poll adds only what it knows of the poll: when, how long, its own counters.
        return answer.polled(observed_at=now, duration=now - started, asked_at=asked_at,
                             wal_dating=self._extras.wal_dating(), wal_clock=self._extras.scanner.clock_read(),
                             view_errors_total=dict(self._reader.view_errors), connects_total=self._connects)

    def _failed(self, error: NodeError, started: float) -> NodeObservation:
        kind = error.kind
        message = redact_text(str(error), [self._password_for_redaction()])
        self._reader.forget_kept()  # no answer: what the slow views read last is not carried past it
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

    async def _poll_once(self, board: ReplayBoard | None, deadline: float) -> tuple[NodeObservation, float]:
        """The node's answer, and when it was asked for; its extra reads end by ``deadline``
        where they can (extrareads.py)."""
        conn = await self._connection()
        assert self._caps is not None
        asked_at = time.monotonic()
        try:
            answer = await self._session.ask(self._query(conn, self._caps, board, deadline), self.query_timeout)
        except TimeoutError:
            raise NodeError("timeout", f"no answer within {self.query_timeout:.3g}s") from None
        except psycopg.errors.QueryCanceled as exc:
            # Its statement_timeout (or a cancel): the server is there and said so, slower
            # than the deadline on a busy host. No evidence of down, and its session is kept
            # (a reconnect would cost the busy host more).
            raise _SlowError(flat_message(exc)) from None
        except psycopg.OperationalError as exc:
            await self._disconnect()
            raise NodeError("query", flat_message(exc)) from None
        except psycopg.Error as exc:
            # A failover can turn a query invalid for the role; probe again next cycle.
            self._caps = None
            raise NodeError("query", flat_message(exc)) from None
        if answer.position is None or answer.position.in_recovery != self._caps.in_recovery:
            # Promoted or demoted under us: an answer like any other (the tracker follows
            # roles as observed); the next cycle chooses the queries for the new role.
            self._caps = None
        if self._reader.probe_again:  # a grant taken away since the probe (viewreader.py)
            self._reader.probe_again, self._caps = False, None
        return answer, asked_at

    async def _connection(self) -> psycopg.AsyncConnection[dict[str, Any]]:
        if self.connection is not None and not self.connection.closed and self._caps is not None:
            return self.connection
        if self.connection is None or self.connection.closed:
            if time.monotonic() < self._next_attempt:
                raise NodeError("connect", f"waiting to reconnect after: {self._last_error}", backing_off=True)
            try:
                conninfo = build_conninfo(self.node_config, self.connect_timeout, self.query_timeout,
                                          poller_application_name(self.cluster.name, self.node),
                                          self.cluster.schemas)
            except PasswordUnavailableError as exc:
                raise NodeError("connect", str(exc)) from None
            self._connects += 1
            try:
                conn = await self._session.connect(conninfo, self.connect_timeout, autocommit=True,
                                                   row_factory=dict_row)
            except TimeoutError:
                raise NodeError("connect", f"could not connect within {self.connect_timeout:.3g}s") from None
            except psycopg.Error as exc:
                raise NodeError("connect", flat_message(exc)) from None
            self._reader.new_connection(conn.info.user)
        assert self.connection is not None
        try:
            caps = await self._session.ask(self._probe(self.connection), self.query_timeout)
        except (TimeoutError, psycopg.Error) as exc:
            await self._disconnect()
            raise NodeError("connect", f"probe failed: {flat_message(exc) or 'timeout'}") from None
        if caps.version_num < MIN_VERSION_NUM:
            await self._disconnect()
            raise NodeError("connect", f"PostgreSQL {caps.version_num} is not supported (13 or later)")
        self._caps = caps
        if caps.in_recovery:
            await self._set_conflict_queries(self.connection)
        # A new session, or the server's role changed: its WAL may not be the one read
        # before (a failover forks it), so the commits listed are forgotten.
        self._extras.scanner.forget()
        self.say_skipped(caps)
        return self.connection

    async def _set_conflict_queries(self, conn: psycopg.AsyncConnection[dict[str, Any]]) -> None:
        """Set, for this session, whether the view reads the query text of the sessions
        holding replay (views/recovery.py): conflict_query_text, off unless the operator
        says so, and set off explicitly (whatever the role's settings say)."""
        try:
            await self._session.ask(conn.execute(_QUERY_TEXT_SQL[self.conflict_query_text]), self.query_timeout)
        except (TimeoutError, psycopg.OperationalError) as exc:
            await self._disconnect()  # the session is gone or busy, as after a failed probe
            raise NodeError("connect", f"setting up the session failed: {flat_message(exc) or 'timeout'}") from None
        except psycopg.Error as exc:
            # An option, not the node's health: the node stays up without the query text.
            # Off, the text is dropped from the answer anyway (_query).
            log.warning("%s/%s: conflict_query_text is not in force on this session (%s)", self.cluster.name,
                        self.node, flat_message(exc))

    @staticmethod
    async def _probe(conn: psycopg.AsyncConnection[dict[str, Any]]) -> Capabilities:
        cursor = await conn.execute(_PROBE_SQL)
        return probe.parse(await cursor.fetchall())

    def say_skipped(self, caps: Capabilities) -> None:  # what it cannot read: said once per poller
        self._reader.say_skipped(caps, self.cluster.walinspect)

    async def _query(self, conn: psycopg.AsyncConnection[dict[str, Any]], caps: Capabilities,
                     board: ReplayBoard | None, deadline: float) -> NodeObservation:
        read = await self._reader.read(conn, caps)
        answered_at = time.monotonic()
        self._answered = True
        health = read.health
        position = read.of(server.VIEW)
        if position is None:
            raise NodeError("query", read.failed.get("server", "no answer from the server view"))
        inspection = await self._extras.inspect(conn, self.cluster, caps, position, self.role == "primary",
                                                self._reader.is_resting, self._reader.note_failure, deadline)
        if self._extras.inspector.state is not None:
            health["walinspect"] = self._extras.inspector.state
        senders = read.of(replication.VIEW) or Senders((), ())
        walsenders = senders.physical
        wal_commits = {}
        if self._dates_from_wal(caps):
            self._extras.scanner.locate = caps.can_walinspect  # pg_get_wal_stats too: counted before described
            wal_commits = await self._extras.dates(conn, self.cluster, position, senders, board,
                                                 self._reader.note_failure, deadline)
            if self._extras.scanner.state is not None:
                health["wal_dating"] = self._extras.scanner.state
        # observed_at and duration are the poll's, set when it ends (_observe).
        return NodeObservation(cluster=self.cluster.name, node=self.node, role=self.role, observed_at=answered_at,
                               duration=0.0, answered_at=answered_at, capabilities=caps, position=position,
                               walsenders=walsenders, receiver=read.of(wal_receiver.VIEW),
                               walinspect=inspection, wal_commits=wal_commits, heartbeat_seq=self._beat_read(read),
                               views=health, recovery=self._recovery(read),
                               logical=senders.logical,
                               rooms={v.name: read.results[v.name] for v in rooms.VIEWS if v.name in read.results})

    def _recovery(self, read: ViewsRead) -> recovery.Recovery | None:
        """The startup process as read, without other sessions' query text unless
        conflict_query_text is on (whatever the server sent: the session's setting is one
        guard, this the other)."""
        found = read.of(recovery.VIEW)
        if found is not None and (reads := read.of(startup_io.VIEW)) is not None:  # one poll in ten
            found = replace(found, startup_reads=reads)
        return found if found is None or self.conflict_query_text else recovery.without_query_text(found)

    def _beat_read(self, read: ViewsRead) -> int | None:
        """The heartbeat this replica has replayed, where the cluster has one."""
        return read.of(self._beat_view) if self._beat_view is not None else None

    def _dates_from_wal(self, caps: Capabilities) -> bool:
        """Whether this poll reads commit times from the WAL: on the primary's DSN, where
        pg_walinspect is installed and permitted and the cluster does not turn it off."""
        return (self.role == "primary" and self.cluster.lag_from_wal == "auto" and not caps.in_recovery
                and caps.can_walinspect_records and not self._reader.is_resting("wal_dating"))

    async def close(self) -> None:
        await self._poll.cancel()
        await self._disconnect()

    async def _disconnect(self) -> None:
        """Close the connection (from within a poll: unlike ``close``, the poll goes on)."""
        self._caps = None
        await self._session.close()


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
    boards: dict[str, ReplayBoard] = {}
    polls = [p.start(boards.setdefault(p.cluster.name, ReplayBoard())) for p in pollers]
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
