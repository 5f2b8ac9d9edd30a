"""The primary's extra reads, after its answer, within its cycle: the WAL inspection
(pg_walinspect's FPI statistics, walinspector.py), the replicas' own positions of the
cycle (replayboard.py) and the commit times in the WAL past them (commitscan.py).

Each may take a quarter of the poll's deadline or the interval, whichever is shorter, and
no more than the time left till the cycle stops waiting for the poll; one with less than
MIN_EXTRA left is not made. A primary late for its cycle leaves the cycle unread
(evidence.py carries the cluster over) and its answer, taken a cycle late, is older than
the replicas' of the next (estimate/dating.py then lets a replica past it keep its last reading).
On a busy host three quarters added up, and the reads' answers came tens of milliseconds
after the server was done with them (the server 3-13 ms, the answer 40-77 ms, measured
under a big UPDATE with four CPU-bound neighbours): one primary poll in twenty was late at
`100ms`. The time the server spends is what a budget bounds; the way back is the host's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from lagwatch.config import ClusterConfig
from lagwatch.read.commitscan import CommitScanner
from lagwatch.read.replayboard import ReplayBoard
from lagwatch.read.walinspector import WalInspector
from lagwatch.views.probe import Capabilities
from lagwatch.views.replication import Senders, WalSender, logical_key
from lagwatch.views.server import ServerPosition
from lagwatch.views.walcommits import WalCommits, WalDatingTotals
from lagwatch.views.walinspect import WalInspection

# Seconds: a read given less is not made (its statement timeout would cancel it before it
# decoded anything worth having, and the cancel would read as the WAL being slow to read).
MIN_EXTRA = 0.005


class ExtraReads:
    """One primary poller's extra reads and what they keep between cycles.

    It keeps no cluster config of its own: each read takes the one in force from its
    poller, so a reload or discovery that adds a replica while the poller is kept reaches
    the reads in the same step (a copy made here once missed it: a replica added later was
    filtered out of the replay board and never WAL-dated). What it is built from, the read
    sizes and the pacing, makes a new poller when it changes (runtime._pollers)."""

    def __init__(self, scan_max_bytes: int, interval: float, query_timeout: float) -> None:
        self.interval = interval
        self.query_timeout = query_timeout
        self.inspector = WalInspector(interval, time.monotonic())
        self.scanner = CommitScanner(scan_max_bytes)
        self._board: ReplayBoard | None = None  # the board of the last cycle read: what came after its read

    def wal_dating(self) -> WalDatingTotals | None:
        """The WAL dating's reads since start, once it has read (NodeObservation.wal_dating)."""
        return self.scanner.totals if self.scanner.state is not None else None

    def budget(self, deadline: float) -> float:
        """What the next extra read may take before the server cancels it (see above)."""
        return min(max(MIN_EXTRA, min(self.query_timeout, self.interval) / 4), deadline - time.monotonic())

    async def inspect(self, conn: psycopg.AsyncConnection[Any], cluster: ClusterConfig, caps: Capabilities,
                      position: ServerPosition, primary_dsn: bool, resting: Callable[[str], bool],
                      note_failure: Callable[[str, str], None], deadline: float) -> WalInspection | None:
        """The WAL inspection due this cycle, if any and if there is time for it (walinspector.py)."""
        budget = self.budget(deadline)
        if budget < MIN_EXTRA:
            return None  # still due: the next cycle with time makes it
        return await self.inspector.inspect(conn, caps, position.current_lsn, cluster, primary_dsn, resting,
                                            note_failure, budget, time.monotonic())

    async def dates(self, conn: psycopg.AsyncConnection[Any], cluster: ClusterConfig, position: ServerPosition,
                    senders: Senders, board: ReplayBoard | None, note_failure: Callable[[str, str], None],
                    deadline: float) -> dict[str, WalCommits]:
        """Each walsender's and logical consumer's commit dates (commitscan.py), read from
        where the replicas said they are this cycle, as far as they have said by then."""
        own = await self.replicas_own(cluster, board, senders.physical, deadline)
        consumers = {logical_key(s.slot_name): s.position for s in senders.logical if s.position is not None}
        budget = self.budget(deadline)
        return await self.scanner.scan(conn, senders.physical, position.current_lsn, cluster.name, budget,
                                       note_failure, own, consumers, may_read=budget >= MIN_EXTRA)

    async def replicas_own(self, cluster: ClusterConfig, board: ReplayBoard | None, walsenders: Sequence[WalSender],
                            deadline: float) -> dict[str, int]:
        """Where the configured replicas say they have replayed up to, this cycle, each
        waited for no longer than an extra read's budget. Those the primary does not stream
        to (cut off from it, or cascaded) are waited for as those it does: their own answer
        is all that dates them (a walsender's position dates the others when theirs is
        late), and a read that went ahead without it left a replica cut off just past where
        its stretch ended undated for as long as its answer kept coming after the read. The
        wait costs no more for them: a hung replica's poll goes on across cycles and is
        coming only on the board of the cycle it began; a stopped one's fails at once.
        Where such a replica's answer of this cycle comes too late even so, the position it
        posted the cycle before (before or after that cycle's read) stands in for it, as a
        walsender's last-heard position does for a streamed replica: a replica cut off stays
        where it was, and the WAL past there dates it."""
        if board is None:
            return {}
        configured = {r.walsender_name for r in cluster.replicas}
        last, self._board = self._board, board
        said = last.posted(configured) if last is not None and last is not board else {}
        own = await board.positions(configured, max(0.0, self.budget(deadline)))
        streamed = {s.application_name for s in walsenders}
        return {**{name: lsn for name, lsn in said.items() if name not in streamed}, **own}
