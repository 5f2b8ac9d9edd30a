"""The optional heartbeat: lagwatch's one write, on a session of its own to the primary.

Every ``heartbeat.interval`` it raises the sequence number of its row of the heartbeat
table (one small UPDATE, its own commit, ``synchronous_commit = local`` so that it never
waits on a synchronous standby) and notes when it sent it and when it returned
(beats.BeatLog). Each replica's poll reads the row back in the same statement as its
replay position (views/heartbeat.py); the tracker turns the beat it shows into bounds of
its staleness (beats.Beats.bounds). A beat that is late or lost costs only precision: the
bounds use the times the beats were really made. Off unless a cluster configures it; the
table is the operator's (deploy/sql/lagwatch-heartbeat.sql), lagwatch never creates it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import psycopg

from lagwatch.beats import BeatLog, Beats
from lagwatch.config import ClusterConfig, Config, HeartbeatConfig, NodeConfig, PasswordUnavailableError
from lagwatch.conninfo import build_conninfo
from lagwatch.errors import flat_message
from lagwatch.redact import redact_text
from lagwatch.views.heartbeat import row_id

log = logging.getLogger("lagwatch.heartbeat")

RETRY_MAX = 30.0  # seconds between attempts while the heartbeat cannot be written


class HeartbeatWriter:
    def __init__(self, cluster: ClusterConfig, config: Config) -> None:
        assert cluster.heartbeat is not None
        self.cluster_name = cluster.name
        self.settings: HeartbeatConfig = cluster.heartbeat
        self.primary: NodeConfig = cluster.primary
        self.row = row_id(self.settings.id)
        self.connect_timeout = config.effective_connect_timeout
        self.timeout = config.effective_query_timeout
        self.log = BeatLog()
        self._task: asyncio.Task[None] | None = None
        table = self.settings.table  # checked by the config's pattern: an identifier, maybe schema-qualified
        self._write = (f"INSERT INTO {table} (id, seq) VALUES (%s, %s) "
                       "ON CONFLICT (id) DO UPDATE SET seq = EXCLUDED.seq").encode()
        self._last = f"SELECT seq FROM {table} WHERE id = %s".encode()

    def serves(self, cluster: ClusterConfig) -> bool:
        """Whether this writer beats as ``cluster`` wants (a reload keeps it, and its log)."""
        return cluster.heartbeat == self.settings and cluster.primary == self.primary

    def ensure_started(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"heartbeat {self.cluster_name}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def beats(self) -> Beats:
        return self.log.snapshot()

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                await self._beat_while_connected()
            except (psycopg.Error, TimeoutError, OSError, PasswordUnavailableError) as exc:
                failures += 1
                self.log.failed += 1
                message = redact_text(flat_message(exc), [self._password()])
                if failures == 1:
                    log.warning("%s: cannot write the heartbeat to %s (%s); its bounds are off until it can "
                                "(deploy/sql/lagwatch-heartbeat.sql creates the table and its grant)",
                                self.cluster_name, self.settings.table, message)
                await asyncio.sleep(min(RETRY_MAX, 0.5 * 2 ** min(failures, 6)))  # 1, 2, 4 ... 30 s
            else:
                failures = 0

    async def _beat_while_connected(self) -> None:
        conninfo = build_conninfo(self.primary, self.connect_timeout, self.timeout,
                                  f"lagwatch/{self.cluster_name}/heartbeat")
        conn = await asyncio.wait_for(psycopg.AsyncConnection.connect(conninfo, autocommit=True),
                                      self.connect_timeout * 4)
        try:
            await conn.execute(b"SET synchronous_commit = local")
            cursor = await conn.execute(self._last, (self.row,))
            row = await cursor.fetchone()
            # Go on from the row's number (a restart must not count back: a replica would
            # show a beat the log cannot place).
            seq = int(row[0]) if row and row[0] is not None else 0
            due = time.monotonic()
            while True:
                seq += 1
                sent = time.monotonic()
                await asyncio.wait_for(conn.execute(self._write, (self.row, seq)), self.timeout)
                self.log.add(seq, sent, time.monotonic())
                # On a schedule, but never a burst to catch up after a late beat.
                due = max(due + self.settings.interval, time.monotonic())
                await asyncio.sleep(due - time.monotonic())
        finally:
            with contextlib.suppress(Exception):
                await conn.close()

    def _password(self) -> str | None:
        try:
            return self.primary.password()
        except PasswordUnavailableError:
            return None
