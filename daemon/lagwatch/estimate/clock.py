"""The primary's wall clock on lagwatch's monotonic clock: the one converter of a primary's
instants (a commit's time in its WAL, a replica's last replayed commit) into lagwatch's
time, so no two hosts' clocks are ever compared and every instant one reading compares is
put on lagwatch's clock the same way.

The rule, stated once: every answer of the primary (each poll, each WAL read) carries the
clock it read while running the statement, before its answer came back, so
``answered - clock_epoch`` is never less than the true offset; the offset is the least of
those over the last few seconds (clockoffset.py: the quickest answer bounds it tightest,
and a slewing clock moves it by a millisecond or two at most). An instant it converts is
therefore never earlier than the truth, and an age read from it never longer: never an
over-read. A late answer (lagwatch busy, the host starved) only loosens it, within the
window.

A standby cluster's primary is not polled: its commits are read against the standby
leader's last replayed commit as of when it was asked (``standby``), one poll at a time.
"""

from __future__ import annotations

from collections.abc import Iterable

from lagwatch.estimate.clockoffset import ClockOffset
from lagwatch.estimate.lsnclock import WalDates
from lagwatch.views.walcommits import WalCommits


class PrimaryClock:
    """One primary's clock against lagwatch's (one per cluster, forgotten when another
    server becomes the primary)."""

    def __init__(self) -> None:
        self._offset = ClockOffset("at_most")
        self._standby: float | None = None  # a standby leader's offset, as of its last poll

    def note(self, clock_epoch: float | None, answered: float) -> None:
        """One answer of the primary: the clock it read (its epoch seconds) and when the
        answer came (lagwatch's monotonic seconds, never earlier than the one before)."""
        if clock_epoch is not None:
            self._standby = None
            self._offset.note(answered, answered - clock_epoch)

    def note_all(self, samples: Iterable[tuple[float, float]]) -> None:
        for clock_epoch, answered in samples:
            self.note(clock_epoch, answered)

    def standby(self, last_replay_epoch: float | None, asked: float) -> None:
        """A standby leader's last replayed commit, as of when it was asked: the standby
        cluster's commits are read against it (their ages behind the standby leader are
        short by at most the age of its own last commit)."""
        self._standby = None if last_replay_epoch is None else asked - last_replay_epoch

    @property
    def offset(self) -> float | None:
        """Lagwatch's monotonic clock less the primary's wall clock (None: not read yet)."""
        return self._standby if self._standby is not None else self._offset.bound

    def monotonic(self, epoch: float | None) -> float | None:
        """A primary's instant on lagwatch's clock (None: not known, or the clock not read yet)."""
        offset = self.offset
        return None if epoch is None or offset is None else epoch + offset

    def dated(self, read: WalCommits) -> WalDates | None:
        """A WAL read's commits on lagwatch's clock (None: the clock not read yet)."""
        offset = self.offset
        if offset is None:
            return None
        return WalDates(read.start, read.end, tuple((lsn, epoch + offset) for lsn, epoch in read.commits),
                        read.complete)
