"""Leadership between lagwatch instances: a PostgreSQL advisory lock on the primary.

Two instances may watch one cluster for HA; only the holder of the lock applies pool
changes. The lock is held by a dedicated session, so it is released by the server the
moment the holder's connection goes away (process killed, host gone), and the other
instance takes it on its next cycle.

Any role that can log in to the primary can take an advisory lock, so the key is not left
to chance (``leader_lock_key`` makes it a secret; the default is derived from the cluster
name), and more importantly whoever holds it is looked up in ``pg_locks`` every cycle this
instance does not lead: another lagwatch (normal for an HA pair) is said once at INFO; any
other session is a WARNING, a metric (``lagwatch_leader_holder_info``) and an alert,
because then no instance applies pool changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import zlib
from typing import Any

import psycopg
import psycopg.conninfo

from lagwatch.config import ClusterConfig, PasswordUnavailableError
from lagwatch.conninfo import build_conninfo, connected_address
from lagwatch.snapshot import LEADER_APPLICATION_NAME, LockHolder

log = logging.getLogger("lagwatch.leader")

# pg_try_advisory_lock(int4, int4): a fixed class id for lagwatch, then the cluster.
LOCK_CLASS = 0x6C6167  # "lag"


# pg_locks shows an advisory lock taken with two int4 keys as classid, objid, objsubid 2.
HOLDER_SQL = """
SELECT l.pid, coalesce(a.application_name, ''), coalesce(a.usename::text, ''),
       coalesce(host(a.client_addr), ''), l.pid = pg_backend_pid()
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
  AND l.classid = %s::oid AND l.objid = %s::oid
LIMIT 1
"""


def lock_key(cluster_name: str, secret: str | None = None) -> tuple[int, int]:
    """The advisory lock's two int4 keys. With ``secret`` (``leader_lock_key``) nobody
    who does not know it can compute the key to take it first."""
    if secret:
        digest = hashlib.sha256(f"lagwatch\0{cluster_name}\0{secret}".encode()).digest()
        return (int.from_bytes(digest[:4], "big") & 0x7FFFFFFF, int.from_bytes(digest[4:8], "big") & 0x7FFFFFFF)
    objid = zlib.crc32(cluster_name.encode()) & 0x7FFFFFFF
    return LOCK_CLASS, objid


class LeaderLock:
    def __init__(self, cluster: ClusterConfig, timeout: float) -> None:
        self.cluster = cluster
        self.timeout = timeout
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self.is_leader = False
        self.holder: LockHolder | None = None  # who holds the lock, as last seen (us included)
        self._said: tuple[int, str, str] | None = None

    def connected_address(self) -> tuple[str, int] | None:
        return connected_address(self._conn)

    async def refresh(self) -> bool:
        """Keep or try to take the lock; returns whether this instance leads now."""
        was = self.is_leader
        task = asyncio.ensure_future(self._refresh())
        try:
            done, _ = await asyncio.wait({task}, timeout=self.timeout)
            if not done:
                # Close the socket before cancelling: psycopg's own cancel would first ask
                # the (possibly hung) server to cancel and wait for it.
                self._drop()
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
                raise TimeoutError(f"no answer within {self.timeout:.3g}s")
            self.is_leader, self.holder = task.result()
        except (TimeoutError, psycopg.Error, OSError, PasswordUnavailableError) as exc:
            log.debug("%s: leader lock check failed: %s", self.cluster.name, exc)
            self.is_leader = False
            self.holder = None
            self._drop()
        if self.is_leader != was:
            log.info("%s: %s", self.cluster.name, "this instance is now the leader (applies pool changes)"
                     if self.is_leader else "this instance is no longer the leader")
        self._say_holder()
        return self.is_leader

    def _say_holder(self) -> None:
        holder = self.holder
        if holder is None or holder.is_us:
            self._said = None
            return
        said = (holder.pid, holder.application_name, holder.user)
        if said == self._said:
            return
        self._said = said
        if holder.is_lagwatch:
            log.info("%s: the leader lock is held by another lagwatch instance (%s): it applies pool changes",
                     self.cluster.name, holder.describe())
        else:
            log.warning("%s: the leader lock is held by a session that is not lagwatch (%s): no lagwatch "
                        "instance applies pool changes for this cluster until it lets go; see the runbook "
                        "of LagwatchPoolControlNotApplied", self.cluster.name, holder.describe())

    async def _refresh(self) -> tuple[bool, LockHolder | None]:
        if self._conn is None or self._conn.closed:
            self.is_leader = False
            conninfo = build_conninfo(self.cluster.primary, self.timeout, self.timeout)
            # Server-side keepalives: if this host vanishes (a partition), the server drops
            # the session, and so the lock, within about 25 s instead of the kernel's 2 h.
            options = str(psycopg.conninfo.conninfo_to_dict(conninfo).get("options", ""))
            options += " -c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3"
            conninfo = psycopg.conninfo.make_conninfo(conninfo, application_name=LEADER_APPLICATION_NAME,
                                                      options=options.strip())
            self._conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        key = lock_key(self.cluster.name, self.cluster.leader_lock_key)
        if self.is_leader and self.holder is not None:
            await self._conn.execute("SELECT 1")
            return True, self.holder
        cursor = await self._conn.execute("SELECT pg_try_advisory_lock(%s, %s)", key)
        row = await cursor.fetchone()
        leads = bool(row and row[0])
        # Who holds it: ourselves (once, for the metric), or the session keeping us out.
        cursor = await self._conn.execute(HOLDER_SQL, key)
        found = await cursor.fetchone()
        holder = LockHolder(int(found[0]), str(found[1]), str(found[2]), str(found[3]), bool(found[4])) \
            if found else None
        return leads, holder

    def _drop(self) -> None:
        # Close the socket without a round trip: the server releases the lock on its own.
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.pgconn.finish()

    def release(self) -> None:
        """Give up the lock (if held) by closing the session."""
        self.is_leader = False
        self.holder = None
        self._drop()

    async def close(self) -> None:
        self.release()
