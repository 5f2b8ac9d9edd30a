"""What the heartbeat says of a replica's staleness: bounds from the beats it has replayed.

lagwatch writes the beats itself (heartbeat.py), each a commit raising a row's sequence
number, and notes when it sent each and when the commit returned, on its own monotonic
clock. A replica that shows beat ``s`` has replayed every commit made before that beat's;
it lacks beat ``s + 1`` if that was made. So at the moment it was read:

- the staleness is at least ``now - done[s + 1]`` (it lacks a change at least that old);
- and at most ``now - sent[s]`` (what it lacks was made after beat ``s``).

The two are about one heartbeat interval apart (plus the beats' own round trips) however
uneven the load, on a cascaded replica as on any other: the same reasoning as the tests'
oracle (tests/integration/oracle.py), with no clock but lagwatch's. Pure: the writer hands
a ``Beats`` snapshot to the tracker each cycle.
"""

from __future__ import annotations

import bisect
from array import array
from dataclasses import dataclass

# Beats remembered: at the default 25 ms, the last ~200 s. A replica further behind reads
# only the lower bound the oldest remembered beat gives.
MAX_BEATS = 8192


class BeatLog:
    """The writer's record of its beats (sequence numbers only ever rise)."""

    def __init__(self, max_beats: int = MAX_BEATS) -> None:
        self.max_beats = max_beats
        self._seq = array("q")
        self._sent = array("d")
        self._done = array("d")
        self.written = 0  # beats written since start
        self.failed = 0  # attempts that failed (a connection, a statement)

    def add(self, seq: int, sent: float, done: float) -> None:
        if self._seq and seq <= self._seq[-1]:
            self.clear()  # the count went back (another writer, a restored primary): start afresh
        self.written += 1
        self._seq.append(seq)
        self._sent.append(sent)
        self._done.append(done)
        if len(self._seq) > self.max_beats:
            drop = len(self._seq) - self.max_beats // 2  # the older half: amortised O(1) a beat
            del self._seq[:drop], self._sent[:drop], self._done[:drop]

    def clear(self) -> None:
        del self._seq[:], self._sent[:], self._done[:]

    def snapshot(self) -> Beats:
        return Beats(tuple(self._seq), tuple(self._sent), tuple(self._done), self.written, self.failed)


@dataclass(frozen=True)
class Beats:
    seq: tuple[int, ...]
    sent: tuple[float, ...]
    done: tuple[float, ...]
    written: int = 0
    failed: int = 0

    def bounds(self, replayed: int, at: float) -> tuple[float, float | None] | None:
        """(lower, upper) bounds of the staleness at ``at`` of a replica that showed beat
        ``replayed`` (read with its replay position, both dated ``at``: estimate/lsnclock.py); upper None
        where the beat is older than the log. None: the beat is not this writer's, or no
        beat was written."""
        if not self.seq or replayed > self.seq[-1]:
            return None
        i = bisect.bisect_left(self.seq, replayed)
        if i < len(self.seq) and self.seq[i] == replayed:
            after = i + 1  # the first beat it lacks, if it was made by then
            upper: float | None = max(0.0, at - self.sent[i])
        elif i == 0:
            after, upper = 0, None  # older than the log: it lacks every beat remembered
        else:
            return None  # a gap in the log: no statement
        lower = at - self.done[after] if after < len(self.seq) and self.done[after] <= at else 0.0
        if upper is not None:
            lower = min(lower, upper)
        return max(0.0, lower), upper
