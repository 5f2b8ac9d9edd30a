"""Leadership between lagwatch instances: a PostgreSQL advisory lock on the primary.

Two instances may watch one cluster for HA; only the holder of the lock applies pool
changes. The lock is held by a dedicated session, so it is released by the server the
moment the holder's connection goes away (process killed, host gone), and the other
instance takes it on its next cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from typing import Any

import psycopg
import psycopg.conninfo

from lagwatch.config import ClusterConfig, PasswordUnavailableError
from lagwatch.conninfo import build_conninfo

log = logging.getLogger("lagwatch.leader")

# pg_try_advisory_lock(int4, int4): a fixed class id for lagwatch, then the cluster.
LOCK_CLASS = 0x6C6167  # "lag"


def lock_key(cluster_name: str) -> tuple[int, int]:
    objid = zlib.crc32(cluster_name.encode()) & 0x7FFFFFFF
    return LOCK_CLASS, objid


class LeaderLock:
    def __init__(self, cluster: ClusterConfig, timeout: float) -> None:
        self.cluster = cluster
        self.timeout = timeout
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self.is_leader = False

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
            self.is_leader = task.result()
        except (TimeoutError, psycopg.Error, OSError, PasswordUnavailableError) as exc:
            log.debug("%s: leader lock check failed: %s", self.cluster.name, exc)
            self.is_leader = False
            self._drop()
        if self.is_leader != was:
            log.info("%s: %s", self.cluster.name, "this instance is now the leader (applies pool changes)"
                     if self.is_leader else "this instance is no longer the leader")
        return self.is_leader

    async def _refresh(self) -> bool:
        if self._conn is None or self._conn.closed:
            self.is_leader = False
            conninfo = build_conninfo(self.cluster.primary, self.timeout, self.timeout)
            # Server-side keepalives: if this host vanishes (a partition), the server drops
            # the session, and so the lock, within about 25 s instead of the kernel's 2 h.
            options = str(psycopg.conninfo.conninfo_to_dict(conninfo).get("options", ""))
            options += " -c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3"
            conninfo = psycopg.conninfo.make_conninfo(conninfo, application_name="lagwatch-leader",
                                                      options=options.strip())
            self._conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        if self.is_leader:
            await self._conn.execute("SELECT 1")
            return True
        cursor = await self._conn.execute("SELECT pg_try_advisory_lock(%s, %s)", lock_key(self.cluster.name))
        row = await cursor.fetchone()
        return bool(row and row[0])

    def _drop(self) -> None:
        # Close the socket without a round trip: the server releases the lock on its own.
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.pgconn.finish()

    def release(self) -> None:
        """Give up the lock (if held) by closing the session."""
        self.is_leader = False
        self._drop()

    async def close(self) -> None:
        self.release()
