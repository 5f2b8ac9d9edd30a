"""Where a cluster's replicas said their replay stands, this cycle, for the primary's WAL read.

The primary's view of a replica (its walsender's ``replay_lsn``) is as old as the
replica's last reply, and a replica replaying through a big transaction moves megabytes
between two replies: a commit read from there within the read's budget would not reach
the place the replica's own answer says it is at, and that replica would go undated
(commitscan.py). So each cycle the replicas' polls post their own replay positions here,
and the primary's poll, its own answer taken, waits for them briefly before it reads the
commit times from the WAL: it reads from where each replica is, which is what dates it.

One board per cluster per cycle (poll.poll_all): a poll still under way from an earlier
cycle posts to that cycle's board, so nothing on a board is older than its cycle; what a
replica the primary does not stream to posts after the read, the next cycle's read takes
from there (extrareads.py). Plain asyncio, one event loop: a replica's poll says it is
coming before the primary's poll can get past its first round trip.
"""

from __future__ import annotations

import asyncio
import contextlib


class ReplayBoard:
    def __init__(self) -> None:
        self._coming: set[str] = set()
        self._posted: dict[str, int] = {}  # by walsender name: the replica's own replay LSN
        self._changed = asyncio.Event()

    def expect(self, name: str) -> None:
        """A replica's poll has begun: its position is worth waiting for."""
        self._coming.add(name)

    def post(self, name: str, replay_lsn: int | None) -> None:
        """The replica's poll ended: where it has replayed up to (None: it did not say)."""
        self._coming.discard(name)
        if replay_lsn is not None:
            self._posted[name] = replay_lsn
        self._changed.set()

    async def positions(self, names: set[str], timeout: float) -> dict[str, int]:
        """The positions posted for ``names``, once every one of them that is coming has
        posted, or ``timeout`` seconds have passed (whatever is there by then)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self._coming & names:
            self._changed.clear()
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)
        return self.posted(names)

    def posted(self, names: set[str]) -> dict[str, int]:
        """The positions posted for ``names`` so far, without waiting: on the board of a
        cycle whose read is done, what came after it (extrareads.py reads past it next)."""
        return {name: lsn for name, lsn in self._posted.items() if name in names}
