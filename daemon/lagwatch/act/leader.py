"""Leadership between lagwatch instances: a PostgreSQL advisory lock per cluster on its primary.

Two instances may watch one cluster for HA; only the holder of the cluster's lock applies
its pool changes. Each lock is held by a session of lagwatch's own on the primary, so the
server releases it the moment that session goes away (process killed, host gone), and
the other instance takes it on its next cycle.

A fleet's clusters often share primary servers, so one session per primary server holds
the locks of every cluster on it (``Leadership``): per cycle and server one round trip,
which proves the session (and so its locks) alive, and tries at once every lock it does
not hold yet. Nothing per cluster per cycle: who holds a lock this instance could not
take (``pg_locks`` joined to ``pg_stat_activity``, costly on a busy server) is looked up
when leadership changes and every ``HOLDER_EVERY`` cycles meanwhile.

Any role that can log in to the primary can take an advisory lock, so the key is not left
to chance (``leader_lock_key`` makes it a secret; the default is derived from the cluster
name), and whoever holds a lock this instance wants is named: another lagwatch (normal
for an HA pair) once at INFO; any other session is a WARNING, a metric
(``lagwatch_leader_holder_info``) and an alert, because then no instance applies pool
changes. Another lagwatch is a session that calls itself ``lagwatch-leader`` *and* runs as
the role this instance's own leader session logs in as: anyone may set an
application_name. What is left: a lock key is visible in ``pg_locks`` once taken, so a
role that can log in may take it first (after a restart of every instance) and hold it;
lagwatch cannot prevent that, only name it and page (LagwatchPoolControlNotApplied, 2
minutes). A session of lagwatch's own role is trusted: its password is the secret.

The session's deadlines count lagwatch's attention (session.py): a late lagwatch never
drops its lock session (which would hand every cluster to the other instance for
nothing); a cycle that did not get its answer in time knows nothing new of leadership,
and the clusters on that session make no pool decision that cycle.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import psycopg
import psycopg.conninfo

from lagwatch.config import NodeConfig, PasswordUnavailableError
from lagwatch.estimate.snapshot import LEADER_APPLICATION_NAME, LockHolder
from lagwatch.read.conninfo import build_conninfo, connected_address, serves_as
from lagwatch.read.session import Outlasting, Session, SessionContext

log = logging.getLogger("lagwatch.act.leader")

# pg_try_advisory_lock(int4, int4): a fixed class id for lagwatch, then the cluster.
LOCK_CLASS = 0x6C6167  # "lag"
# Cycles between two look-ups of who holds the locks this instance could not take.
HOLDER_EVERY = 30
# Clusters a leadership line names before "and N more".
NAMED = 5

# Tries every lock at once: the ordinals of those taken.
TRY_SQL = """
SELECT k.i FROM unnest(%s::int4[], %s::int4[]) WITH ORDINALITY AS k(c, o, i)
WHERE pg_try_advisory_lock(k.c, k.o)
"""
# pg_locks shows an advisory lock taken with two int4 keys as classid, objid, objsubid 2.
HOLDERS_SQL = """
SELECT l.classid::int8, l.objid::int8, l.pid, coalesce(a.application_name, ''), coalesce(a.usename::text, ''),
       coalesce(host(a.client_addr), '')
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
  AND (l.classid, l.objid) IN (SELECT k.c::oid, k.o::oid FROM unnest(%s::int4[], %s::int4[]) AS k(c, o))
"""
ME_SQL = "SELECT pg_backend_pid(), current_user::text, coalesce(host(inet_client_addr()), '')"


def lock_key(cluster_name: str, secret: str | None = None) -> tuple[int, int]:
    """The advisory lock's two int4 keys. With ``secret`` (``leader_lock_key``) nobody
    who does not know it can compute the key to take it first."""
    if secret:
        digest = hashlib.sha256(f"lagwatch\0{cluster_name}\0{secret}".encode()).digest()
        return (int.from_bytes(digest[:4], "big") & 0x7FFFFFFF, int.from_bytes(digest[4:8], "big") & 0x7FFFFFFF)
    objid = zlib.crc32(cluster_name.encode()) & 0x7FFFFFFF
    return LOCK_CLASS, objid


class Claim(NamedTuple):
    """A cluster whose lock this instance wants: on which primary, under which key."""

    primary: NodeConfig
    key: tuple[int, int]


@dataclass(frozen=True)
class Standing:
    """A cluster's leadership as this cycle knows it."""

    leads: bool | None  # None: not known this cycle (the lock session's answer came too late, or it connects)
    holder: LockHolder | None  # who holds the lock, as last seen (this instance included)


UNKNOWN = Standing(None, None)


class _LockSession:
    """One session on one primary server, holding the locks of the clusters assigned to it."""

    def __init__(self, primary: NodeConfig, context: SessionContext, connect_timeout: float,
                 query_timeout: float) -> None:
        self.primary = primary
        self.session = Session(context)
        self.connect_timeout, self.query_timeout = connect_timeout, query_timeout
        self.keys: dict[str, tuple[int, int]] = {}  # assigned cluster -> its key
        self.held: dict[str, tuple[int, int]] = {}  # cluster -> the key this session holds for it
        self.holders: dict[str, LockHolder] = {}  # clusters whose lock another session holds: who
        self.known = False  # whether this cycle's round trip answered
        self.releases: list[tuple[int, int]] = []  # keys to let go of with the next round trip
        self.me: LockHolder | None = None  # this session as the server knows it (once connected)
        self._holders_in = 0  # cycles until the holders are looked up again
        self._trip: Outlasting[None] = Outlasting()  # the round trip under way

    def serves(self, primary: NodeConfig) -> bool:
        return self.primary == primary or serves_as(self.primary, primary, connected_address(self.session.conn))

    def assign(self, cluster: str, key: tuple[int, int]) -> None:
        if self.keys.get(cluster) != key:
            self.unassign(cluster)
            self.keys[cluster] = key

    def unassign(self, cluster: str) -> None:
        self.keys.pop(cluster, None)
        self.holders.pop(cluster, None)
        key = self.held.pop(cluster, None)
        if key is not None and self.session.open:
            self.releases.append(key)

    def standing(self, cluster: str) -> Standing:
        if not self.known:
            return UNKNOWN
        if cluster in self.held:
            return Standing(True, self.me)
        return Standing(False, self.holders.get(cluster))

    # -- one round trip a cycle ------------------------------------------------------------

    def start(self) -> asyncio.Future[None]:
        """This cycle's round trip: one still under way from an earlier cycle, one that
        ended after its cycle stopped waiting (taken now), or a new one."""
        self.known = False
        return self._trip.start(self._round_trip)

    def settle(self, now: float) -> None:
        """After the cycle's wait: take the round trip's outcome. One still under way knows
        nothing this cycle (lagwatch late, a slow server, a first connection): no pool
        decision for its clusters. One past its deadline (lagwatch's attention) and still
        silent is ended: its locks count as lost from the cycle that takes that outcome."""
        trip = self._trip.current
        if trip is None:
            return
        if trip.done():
            self._trip.take(trip)
            self.known = True
            return
        self.session.expire_overdue(now)

    async def _round_trip(self) -> None:
        # A lost session is made again the next cycle, without backing off: one attempt a
        # cycle per primary server, and after a failover the new primary's locks are taken
        # the first cycle it accepts writes.
        try:
            conn = await self._connection()
            await self.session.ask(self._ask(conn), self.query_timeout)
        except asyncio.CancelledError:
            raise
        except (TimeoutError, psycopg.Error, OSError, PasswordUnavailableError) as exc:
            self._lost(str(exc) or type(exc).__name__)
        except Exception:  # a bug must not end leadership checks for good; logged with its trace
            log.exception("leader lock session on %s failed unexpectedly", _where(self.primary))
            self._lost("internal error")

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self.session.open:
            assert self.session.conn is not None
            return self.session.conn
        conninfo = build_conninfo(self.primary, self.connect_timeout, self.query_timeout)
        # Server-side keepalives: if this host vanishes (a partition), the server drops
        # the session, and so the locks, within about 25 s instead of the kernel's 2 h.
        options = str(psycopg.conninfo.conninfo_to_dict(conninfo).get("options", ""))
        options += " -c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3"
        conninfo = psycopg.conninfo.make_conninfo(conninfo, application_name=LEADER_APPLICATION_NAME,
                                                  options=options.strip())
        self.held, self.holders, self.releases, self._holders_in = {}, {}, [], 0
        conn = await self.session.connect(conninfo, self.connect_timeout, autocommit=True)
        cursor = await self.session.ask(conn.execute(ME_SQL), self.query_timeout)
        row = await cursor.fetchone()
        assert row is not None
        self.me = LockHolder(int(row[0]), LEADER_APPLICATION_NAME, str(row[1]), str(row[2]), True)
        return conn

    async def _ask(self, conn: psycopg.AsyncConnection[Any]) -> None:
        releases, self.releases = self.releases, []
        for key in releases:  # a cluster that left this session (rare): one statement each
            await conn.execute("SELECT pg_advisory_unlock(%s, %s)", key)
        wanted = [(cluster, key) for cluster, key in self.keys.items() if cluster not in self.held]
        if not wanted:
            await conn.execute("SELECT 1")  # the session, and so every lock it holds, is alive
            return
        cursor = await conn.execute(TRY_SQL, ([k[0] for _, k in wanted], [k[1] for _, k in wanted]))
        taken = {int(row[0]) for row in await cursor.fetchall()}
        for i, (cluster, key) in enumerate(wanted, start=1):
            if i in taken:
                self.held[cluster] = key
                self.holders.pop(cluster, None)
        others = [(cluster, key) for cluster, key in wanted if cluster not in self.held]
        self._holders_in -= 1
        if others and (self._holders_in <= 0 or any(c not in self.holders for c, _ in others)):
            await self._look_up_holders(conn, others)

    async def _look_up_holders(self, conn: psycopg.AsyncConnection[Any],
                               others: list[tuple[str, tuple[int, int]]]) -> None:
        cursor = await conn.execute(HOLDERS_SQL, ([k[0] for _, k in others], [k[1] for _, k in others]))
        ours = self.me.user if self.me is not None else None
        by_key = {(int(r[0]), int(r[1])): LockHolder(int(r[2]), str(r[3]), str(r[4]), str(r[5]), False,
                                                     lagwatch_role=str(r[4]) == ours)
                  for r in await cursor.fetchall()}
        self.holders = {cluster: by_key[key] for cluster, key in others if key in by_key}
        self._holders_in = HOLDER_EVERY

    def _lost(self, why: str) -> None:
        """The session failed: its locks are gone (the server let them go with it)."""
        log.debug("leader lock session on %s lost (%s)", _where(self.primary), why)
        self.held, self.holders, self.releases = {}, {}, []
        self.session.drop()

    async def close(self) -> None:
        await self._trip.cancel()
        self.held = {}
        self.session.drop()  # no round trip: the server releases the locks on its own


def _where(primary: NodeConfig) -> str:
    params = psycopg.conninfo.conninfo_to_dict(primary.dsn)
    return f"{params.get('host') or params.get('hostaddr') or 'localhost'}:{params.get('port') or 5432}"


class Leadership:
    """Every cluster's leader lock this instance wants, one session per primary server.

    Each cycle: ``want`` the clusters under pool control (not in dry run) with their
    primaries and keys; ``start`` the round trips (one per session) beside the polls;
    ``settle`` once the cycle stops waiting; then ``standing`` tells each cluster's."""

    def __init__(self, context: SessionContext, connect_timeout: float, query_timeout: float) -> None:
        self.context = context
        self.connect_timeout, self.query_timeout = connect_timeout, query_timeout
        self.sessions: list[_LockSession] = []  # one per primary server (read them, never change them)
        self.by_cluster: dict[str, _LockSession] = {}  # cluster -> its session (read it, never change it)
        self._said: dict[str, tuple[bool | None, tuple[int, str, str] | None]] = {}
        self._wanted: Mapping[str, Claim] | None = None

    def retime(self, connect_timeout: float, query_timeout: float) -> None:
        """A reload's timeouts (the open sessions stay open)."""
        self.connect_timeout, self.query_timeout = connect_timeout, query_timeout
        for s in self.sessions:
            s.connect_timeout, s.query_timeout = connect_timeout, query_timeout

    async def want(self, claims: Mapping[str, Claim]) -> None:
        """The clusters whose locks this instance wants now. A cluster stays on its session
        while that session serves its primary (discovery changing the writer's host list
        must not hand leadership to the other instance); one no longer wanted, or whose
        primary moved, lets its lock go. The same ``claims`` as last time (the daemon's
        runtime keeps them) cost nothing."""
        if claims is self._wanted:
            return
        self._wanted = claims
        for cluster in [c for c in self.by_cluster if c not in claims]:
            self.by_cluster.pop(cluster).unassign(cluster)
            self._said.pop(cluster, None)
        for cluster, claim in claims.items():
            session = self.by_cluster.get(cluster)
            if session is not None and not ((session.session.open and session.serves(claim.primary))
                                             or session.primary == claim.primary):
                session.unassign(cluster)
                session = None
            if session is None:
                session = next((s for s in self.sessions if s.primary == claim.primary), None)
                if session is None:
                    session = _LockSession(claim.primary, self.context, self.connect_timeout, self.query_timeout)
                    self.sessions.append(session)
                self.by_cluster[cluster] = session
            # Kept on a session that serves its new host list: that list is the one to
            # reconnect with (after a failover to a member that joined meanwhile).
            session.primary = claim.primary
            session.assign(cluster, claim.key)
        idle = [s for s in self.sessions if not s.keys]
        self.sessions = [s for s in self.sessions if s.keys]
        await asyncio.gather(*(s.close() for s in idle))

    def start(self) -> list[asyncio.Future[None]]:
        return [s.start() for s in self.sessions]

    def settle(self, now: float) -> None:
        for s in self.sessions:
            s.settle(now)
        self.say_changes()

    def standing(self, cluster: str) -> Standing:
        session = self.by_cluster.get(cluster)
        return session.standing(cluster) if session is not None else Standing(False, None)

    def say_changes(self) -> None:
        """What changed since the last cycle, in few lines: which clusters this instance
        now leads or no longer leads, and who holds the locks it cannot take."""
        became, ceased = [], []
        for cluster in self.by_cluster:
            standing = self.standing(cluster)
            if standing.leads is None:
                continue
            holder = standing.holder
            said = (standing.leads, None if holder is None or holder.is_us
                    else (holder.pid, holder.application_name, holder.user))
            before = self._said.get(cluster)
            if said == before:
                continue
            self._said[cluster] = said
            was_leader = before is not None and before[0]
            if standing.leads and not was_leader:
                became.append(cluster)
            elif not standing.leads and was_leader:
                ceased.append(cluster)
            if said[1] is not None and (before is None or before[1] != said[1]):
                assert holder is not None
                if holder.is_lagwatch:
                    log.info("%s: the leader lock is held by another lagwatch instance (%s): it applies pool "
                             "changes", cluster, holder.describe())
                else:
                    impostor = ("; it calls itself lagwatch-leader but does not run as lagwatch's role"
                                if holder.application_name == LEADER_APPLICATION_NAME else "")
                    log.warning("%s: the leader lock is held by a session that is not lagwatch (%s%s): no lagwatch "
                                "instance applies pool changes for this cluster until it lets go; see the "
                                "runbook of LagwatchPoolControlNotApplied", cluster, holder.describe(), impostor)
        if became:
            log.info("%s: this instance is now the leader (applies pool changes)", _names(became))
        if ceased:
            log.info("%s: this instance is no longer the leader", _names(ceased))

    async def close(self) -> None:
        sessions, self.sessions, self.by_cluster = self.sessions, [], {}
        await asyncio.gather(*(s.close() for s in sessions))


def _names(clusters: list[str]) -> str:
    shown = ", ".join(clusters[:NAMED])
    return shown + (f" and {len(clusters) - NAMED} more cluster(s)" if len(clusters) > NAMED else "")
