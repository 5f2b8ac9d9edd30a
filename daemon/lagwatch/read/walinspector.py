"""Reading the primary's WAL with pg_walinspect, a cycle now and then: where the last
inspection ended, when the next is due, and what happens when one fails.

FPI statistics of the WAL since the last inspection: a second round trip, only on the
primary's DSN, when pg_walinspect is usable and the primary has written something, at most
every WALINSPECT_EVERY seconds (the counters add up the same; a fleet's primaries need not
each pay two more statements a second). At most ``walinspect_max_bytes`` per cycle since
the last inspection is read. Its failures are its own: they never mark the node down. A
node's poller owns one and runs it on its connection (poll.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import psycopg
import psycopg.errors

from lagwatch.config import ClusterConfig
from lagwatch.errors import flat_message
from lagwatch.lsn import format_lsn
from lagwatch.views import walinspect
from lagwatch.views.probe import Capabilities
from lagwatch.views.walinspect import WalInspection

log = logging.getLogger("lagwatch.read.poll")

WALINSPECT_EVERY = 10.0  # seconds: pg_walinspect's FPI statistics are read at most this often
FAILURES_BEFORE_JUMPING = 3  # failed reads from one start before the next starts at the present

# Says a view's failure to its node's poller: (view, error) -> None; the view then rests.
NoteFailure = Callable[[str, str], None]


class WalInspector:
    def __init__(self, interval: float, now: float) -> None:
        self.interval = interval
        self._from: int | None = None  # where the next inspection starts
        self._due = 0.0  # monotonic time of the next inspection
        self._inspected_at = now
        self._failures = 0
        # Whether the last inspection worked (None: not a view of this node), for the
        # node's view health ("walinspect").
        self.state: bool | None = None

    async def inspect(self, conn: psycopg.AsyncConnection[Any], caps: Capabilities, current: int | None,
                      cluster: ClusterConfig, primary_dsn: bool, resting: Callable[[str], bool],
                      note_failure: NoteFailure, budget: float, now: float) -> WalInspection | None:
        """The inspection due this cycle of ``cluster``'s primary, if any (only the poller of
        its primary DSN inspects). ``resting(view)``: whether the node's poller rests that
        view after a failure; ``note_failure``: tell it of one; ``budget``: seconds each
        statement may take before the server cancels it; ``now``: lagwatch's monotonic
        time as it asks (what is due, and how many cycles' bytes it may read)."""
        if cluster.walinspect == "off" or caps.in_recovery or not caps.has_walinspect or not primary_dsn:
            self.state = None
            return None
        if not caps.can_walinspect or resting("walinspect"):
            self.state = False
            return None
        if current is None or now < self._due:
            return None
        start = self._from
        if start is None or current <= start:
            self._from = start if start is not None else current
            return None
        try:
            cycles = max(1, math.ceil((now - self._inspected_at) / self.interval))
            cursor = await conn.execute(walinspect.statement(start, cluster.walinspect_max_bytes * cycles,
                                                             round(budget * 1000)))
            cursor.nextset()  # past SET LOCAL's empty result
            inspection = walinspect.parse(await cursor.fetchall())
        except psycopg.errors.QueryCanceled as exc:
            # Longer than its budget (megabytes of WAL on a busy primary): as any failed
            # read, but never the poll's failure, which would read a live primary down.
            self._failed(cluster.name, start, current, exc)
            return None
        except psycopg.OperationalError:
            raise
        except psycopg.errors.InsufficientPrivilege as exc:
            self.state = False
            note_failure("walinspect", flat_message(exc))
            return None
        except psycopg.Error as exc:
            # Typically no complete record yet after ``start`` (it may sit mid-record).
            self._failed(cluster.name, start, current, exc)
            return None
        self._failures = 0
        self._from = inspection.flush_lsn
        self._inspected_at = now
        self._due = now + max(self.interval, WALINSPECT_EVERY) - self.interval / 2
        self.state = True
        return await self._compression_saved(conn, caps, inspection, resting, note_failure, budget)

    def _failed(self, cluster: str, start: int, current: int, exc: psycopg.Error) -> None:
        """A read that failed: the same start is tried again, but the next starts at the
        present if it keeps failing."""
        self._failures += 1
        log.debug("%s/primary: pg_get_wal_stats from %s failed: %s", cluster, format_lsn(start), flat_message(exc))
        if self._failures >= FAILURES_BEFORE_JUMPING:
            self._from, self._failures = current, 0

    @staticmethod
    async def _compression_saved(conn: psycopg.AsyncConnection[Any], caps: Capabilities, inspection: WalInspection,
                                 resting: Callable[[str], bool], note_failure: NoteFailure,
                                 budget: float) -> WalInspection:
        """What WAL compression saved in the range just inspected (16+, with the grant):
        its failures leave the FPI statistics as they are."""
        if not caps.can_walinspect_blocks or inspection.end_lsn <= inspection.start_lsn \
                or resting("walinspect_blocks"):
            return inspection
        try:
            cursor = await conn.execute(walinspect.blocks_statement(inspection.start_lsn, inspection.end_lsn,
                                                                    round(budget * 1000)))
            cursor.nextset()  # past SET LOCAL's empty result
            compressed = walinspect.parse_blocks(await cursor.fetchall())
        except psycopg.errors.QueryCanceled:
            return inspection  # longer than its budget: this range's savings go unmeasured
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            note_failure("walinspect_blocks", flat_message(exc))
            return inspection
        return replace(inspection, compressed=compressed)


