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

from lagwatch.config import ClusterConfig, Config, HeartbeatConfig, NodeConfig, PasswordUnavailableError
from lagwatch.errors import flat_message
from lagwatch.estimate.beats import BeatLog, Beats
from lagwatch.read.conninfo import build_conninfo
from lagwatch.read.heartbeattable import HeartbeatTableError, check_table
from lagwatch.redact import redact_text
from lagwatch.views.heartbeat import row_id

log = logging.getLogger("lagwatch.read.heartbeat")

RETRY_MAX = 30.0  # seconds between attempts while the heartbeat cannot be written
SEQ_MAX = (1 << 63) - 1  # bigint's: the beat log holds 64-bit numbers (beats.BeatLog)


class HeartbeatWriter:
    def __init__(self, cluster: ClusterConfig, config: Config) -> None:
        assert cluster.heartbeat is not None
        self.cluster_name = cluster.name
        self.settings: HeartbeatConfig = cluster.heartbeat
        self.primary: NodeConfig = cluster.primary
        self.schemas = cluster.schemas
        self.row = row_id(self.settings.id)
        self.connect_timeout = config.effective_connect_timeout
        self.timeout = config.effective_query_timeout
        self.log = BeatLog()
        self._task: asyncio.Task[None] | None = None
        # Checked by the config's pattern (identifiers), and schema-qualified.
        self.table = self.settings.qualified_table(self.schemas)
        self._write = (f"INSERT INTO {self.table} (id, seq) VALUES (%s, %s) "
                       "ON CONFLICT (id) DO UPDATE SET seq = EXCLUDED.seq").encode()
        self._last = f"SELECT seq FROM {self.table} WHERE id = %s".encode()
        self._failures = 0  # attempts failed since the last beat written

    def serves(self, cluster: ClusterConfig) -> bool:
        """Whether this writer beats as ``cluster`` wants (a reload keeps it, and its log)."""
        return (cluster.heartbeat, cluster.primary, cluster.schemas) == (self.settings, self.primary, self.schemas)

    def ensure_started(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"heartbeat {self.cluster_name}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            # _run never ends of itself; should it have, a reload or a shutdown is no place
            # to raise what ended it.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    def beats(self) -> Beats:
        return self.log.snapshot()

    async def _run(self) -> None:
        """Beat until closed. Every failure is counted (``lagwatch_heartbeat_errors_total``)
        and each outage said once, when it begins, and once more when a beat is written
        again; nothing ends the task but ``close``."""
        while True:
            try:
                await self._beat_while_connected()
            except (psycopg.Error, TimeoutError, OSError, PasswordUnavailableError, HeartbeatTableError) as exc:
                self._failed(redact_text(flat_message(exc), [self._password()]))
            except Exception as exc:  # a bug must not end the heartbeat in silence
                if not self._failures:  # its traceback once an outage, as the outage is said once
                    log.exception("%s: heartbeat: internal error", self.cluster_name)
                self._failed(f"internal error: {type(exc).__name__}")
            await asyncio.sleep(min(RETRY_MAX, 0.5 * 2 ** min(self._failures, 6)))  # 1, 2, 4 ... 30 s

    def _failed(self, message: str) -> None:
        self._failures += 1
        self.log.failed += 1
        if self._failures == 1:
            log.warning("%s: cannot write the heartbeat to %s (%s); its bounds are off until it can "
                        "(deploy/sql/lagwatch-heartbeat.sql creates the table and its grant)",
                        self.cluster_name, self.table, message)

    def _written(self) -> None:
        if self._failures:
            log.info("%s: the heartbeat is written again, after %d failed attempt%s", self.cluster_name,
                     self._failures, "" if self._failures == 1 else "s")
            self._failures = 0

    async def _next_seq(self, conn: psycopg.AsyncConnection[tuple[object, ...]]) -> int:
        """The row's number to go on from (a restart must not count back: a replica would
        show a beat the log cannot place), once the table is seen to be fit to beat in (no
        code on it, trusted owners, a bigint column: heartbeattable.py) and to have room
        left in its row."""
        await check_table(conn, self.table)
        cursor = await conn.execute(self._last, (self.row,))
        row = await cursor.fetchone()
        seq = int(str(row[0])) if row and row[0] is not None else 0
        if not 0 <= seq < SEQ_MAX:
            raise HeartbeatTableError(f"its row {self.row!r} holds seq {seq}, where the next beat would not fit "
                                      "a bigint: delete the row, lagwatch starts it again")
        return seq

    async def _beat_while_connected(self) -> None:
        conninfo = build_conninfo(self.primary, self.connect_timeout, self.timeout,
                                  f"lagwatch/{self.cluster_name}/heartbeat", self.schemas)
        conn = await asyncio.wait_for(psycopg.AsyncConnection.connect(conninfo, autocommit=True),
                                      self.connect_timeout * 4)
        try:
            await conn.execute(b"SET synchronous_commit = local")
            seq = await self._next_seq(conn)
            due = time.monotonic()
            while seq < SEQ_MAX:
                seq += 1
                sent = time.monotonic()
                await asyncio.wait_for(conn.execute(self._write, (self.row, seq)), self.timeout)
                self.log.add(seq, sent, time.monotonic())
                self._written()
                # On a schedule, but never a burst to catch up after a late beat.
                due = max(due + self.settings.interval, time.monotonic())
                await asyncio.sleep(due - time.monotonic())
            raise HeartbeatTableError(f"its row {self.row!r} reached the end of bigint: delete the row, lagwatch "
                                      "starts it again")
        finally:
            with contextlib.suppress(Exception):
                await conn.close()

    def _password(self) -> str | None:
        try:
            return self.primary.password()
        except PasswordUnavailableError:
            return None
