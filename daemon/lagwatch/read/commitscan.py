"""Which stretches of the primary's WAL to read for commit times, and what they said.

For each walsender the primary reports, lagwatch keeps the stretch of WAL just past its
replay position (the replica's own answer of the cycle where it came in time,
replayboard.py; else the walsender's) that it has read: every commit in it, up to
``max_commits``. Each cycle the stretch starts again where the replica stood the cycle
before (what was replayed before that is dropped) and, while it holds no commit past
the replica's position and ends short of the primary's position (or the primary is
writing: a replica's answer can come after the primary's), is read on from its end as far
as the primary has flushed, within a budget: the read is planned to take no more than a
share of its time budget at the speed reads have decoded so far, and the server cancels
it at the budget (extrareads.py: at most a quarter of the poll's deadline). Where
permitted a read counts the WAL before it describes it (views/walcommits.py: six times as
far for the same cost). A replica that keeps up costs the WAL written since the last
cycle, read once for every replica at the same place; one further behind costs nothing
once the first commit past it is listed, until it replays past it; one replaying through
a big transaction costs a budget's worth a cycle. The primary's poller owns one and runs
it on its connection after the cycle's views; the tracker dates each replica from what it
yields (lsnclock.date_from_wal, which says what a WalDates holds, once estimate/clock.PrimaryClock
has put the commits' times on lagwatch's clock).
"""
from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import psycopg
import psycopg.errors

from lagwatch.errors import flat_message
from lagwatch.lsn import format_lsn
from lagwatch.views import walcommits
from lagwatch.views.replication import WalSender
from lagwatch.views.walcommits import (
    CHUNK,
    GUARD,
    CommitRead,
    CommitReads,
    LocatedRange,
    WalCommits,
    WalDatingTotals,
)

log = logging.getLogger("lagwatch.read.poll")

# What pg_get_wal_records_info decodes a second before the reads have measured it (a
# cautious guess: each read then measures it), and the least it is taken for.
INITIAL_SPEED = 10e6
MIN_SPEED = 1e6
# A read's time (the server's, from the statement's arrival to the reads' end, where it
# says: walcommits.CommitReads.took; else lagwatch's, round trip and all) is a fixed part
# (parsing, planning) and its decoding: a read of a few kB (a replica keeping up) takes
# about as long whatever its size, and taken for decoding speed it would say ~10 MB/s
# where ~80 are decoded (a primary writing a big transaction). The fixed part is the
# quickest of the last READS_REMEMBERED reads; a read of at least SPEED_READ_BYTES
# measures the speed with its time less that part (and never less than half its time: a
# sample is at most twice what its whole time says, so that from small reads the plan
# grows, read by read, to what the budget decodes).
READS_REMEMBERED = 32
SPEED_READ_BYTES = 8192
# The share of its time budget a read is planned to take at that speed (the server cancels
# it at the whole budget): at most 7.5 % of the interval, the cost bound on the primary.
BUDGET_SHARE = 0.3
# How much faster pg_get_wal_stats counts WAL than pg_get_wal_records_info describes it
# (walcommits.py): 8-10x measured on a big UPDATE's WAL, taken low. A located read counts
# up to this many times the bytes it may describe, and its cost is reckoned in described
# bytes: what it describes, and what it counts over this.
COUNT_FACTOR = 6
# Cycles read without counting first after a located read failed.
PLAIN_CYCLES_AFTER_ERROR = 10
# Cycles a stretch is kept, unread, while its replica's position is not known.
ABSENT_CYCLES = 10
# Commits listed per stretch: the first is what dates a replica; the rest date it as it
# replays on, between two reads, and bound the memory a stretch takes.
MAX_COMMITS = 64


@dataclass(frozen=True)
class _Stretch:
    start: int
    end: int
    commits: tuple[tuple[int, float], ...]  # (LSN, when made: the primary's epoch seconds)
    replay: int  # the walsender's replay position this cycle
    complete: bool = False  # this cycle's read reached the primary's flush position
    exact: bool = True  # ``end`` is where a record starts (walcommits.CommitRead.exact)
    absent: int = 0  # cycles since its replica's position was last known


class CommitScanner:
    def __init__(self, max_bytes: int, max_commits: int = MAX_COMMITS, locate: bool = True) -> None:
        self.max_bytes = max_bytes
        # Whether reads count WAL before they describe it (pg_get_wal_stats, where the role
        # may call it: walcommits.locate_statement); else every record read is described.
        self.locate = locate
        self.max_commits = max_commits
        self._stretches: dict[str, _Stretch] = {}  # by application_name
        self.totals = WalDatingTotals()  # reads since start: bytes, cancelled, failed
        self.state: bool | None = None  # whether the last read worked (None: none yet)
        self.speed = DecodeSpeed()  # what the reads decode a second, as measured
        self._last_lsn: int | None = None  # the primary's position the cycle before
        self._plain_cycles = 0  # cycles left reading without counting first (after a located read failed)
        # The primary's clock as each read since the last dates() read it (clock_epoch, answered):
        # estimate/clock.PrimaryClock takes them with every poll's.
        self._clock: list[tuple[float, float]] = []

    def forget(self) -> None:
        self._stretches = {}

    def plan(self, replays: Mapping[str, int], current_lsn: int, budget_bytes: int | None = None,
             writing: bool = False) -> list[LocatedRange]:
        """The ranges to read this cycle, given each walsender's replay position: from the
        end of each stretch as far as the primary has flushed (the statement stops there),
        also from one at or past ``current_lsn`` while the primary is ``writing`` (a
        replica's own answer can come after the primary's: the read, later still, says
        what was committed in between),
        each described for at most ``max_bytes``, together at most ``budget_bytes`` (shared
        alike, never under 8 kB), and counted COUNT_FACTOR times as far where reads are
        located. Stretches that end at one place share one read. A stretch is read on only
        while it holds no commit past its replica's position: the first is all that dates it.
        One whose replica's position is not known this cycle (a replica with no walsender
        that said nothing in time this cycle nor the last, extrareads.py; a walsender
        reconnecting) is kept unread for ABSENT_CYCLES: the WAL it has read is still what it
        was."""
        stretches = {name: replace(old, complete=False, absent=old.absent + 1) for name, old in self._stretches.items()
                     if name not in replays and old.absent < ABSENT_CYCLES}
        for name, replay in replays.items():
            stretches[name] = _moved_on(self._stretches.get(name), replay, current_lsn)
        self._stretches = stretches
        ends: dict[int, bool] = {}  # where to read from: whether a record starts there
        for s in stretches.values():
            if not s.absent and (s.end < current_lsn or writing) and not any(lsn >= s.replay for lsn, _ in s.commits):
                ends[s.end] = ends.get(s.end, False) or s.exact
        if not ends:
            return []
        share = self.max_bytes if budget_bytes is None else max(8192, min(self.max_bytes, budget_bytes // len(ends)))
        counted = min(self.max_bytes, share * COUNT_FACTOR) if self.locate else share
        return [LocatedRange(start, start + counted, start + share if exact else start)
                for start, exact in sorted(ends.items())]

    def absorb(self, read: CommitReads, read_at: float) -> None:
        """What this cycle's ranges held, added to the stretches that end where they begin.
        Commit times stay on the primary's clock; the clock each read took is kept for
        estimate/clock.PrimaryClock, the one converter."""
        if read.clock_epoch is not None:
            self._clock.append((read.clock_epoch, read_at))
        by_start = {r.start: r for r in read.reads}
        self.totals = replace(self.totals, read_bytes=self.totals.read_bytes
                              + sum(max(r.counted_bytes, r.described_bytes) for r in read.reads))
        for name, s in self._stretches.items():
            r = by_start.get(s.end)
            if r is None:
                continue
            commits = s.commits + tuple(r.commits)
            # A read that got nowhere leaves the stretch's end as it was, a record's start or not.
            end, complete, exact = r.scanned_to, r.complete, r.exact if r.scanned_to > r.start else s.exact
            if len(commits) > self.max_commits:
                end, commits, complete, exact = commits[self.max_commits][0], commits[: self.max_commits], False, True
            self._stretches[name] = _Stretch(s.start, end, commits, s.replay, complete, exact)

    def clock_read(self) -> tuple[tuple[float, float], ...]:
        """The primary's clock as the reads since the last call took it: (its epoch seconds,
        when the answer came on lagwatch's clock)."""
        taken, self._clock = tuple(self._clock), []
        return taken

    def dates(self) -> dict[str, WalCommits]:
        """Each walsender's stretch (complete only where this cycle's read reached the flush)."""
        return {name: WalCommits(s.start, s.end, s.commits, complete=s.complete) for name, s in self._stretches.items()}

    async def scan(self, conn: psycopg.AsyncConnection[Any], senders: Sequence[WalSender], current_lsn: int | None,
                   cluster: str, budget: float, note_failure: Callable[[str, str], None],
                   own: Mapping[str, int] | None = None, consumers: Mapping[str, int] | None = None,
                   may_read: bool = True) -> dict[str, WalCommits]:
        """This cycle's reads on the primary's connection, and each walsender's dates. The
        read may take at most ``budget`` seconds (the server cancels it past that: it never
        costs the poll its answer); it asks for no more than that time decodes at the speed
        the reads so far went. ``own``: where replicas said they have replayed up to this
        cycle, by walsender (replayboard.py): read from there rather than from where their
        walsenders last heard of them. ``consumers``: the logical consumers' positions, by
        ``logical_key``: each dated by the first commit past it, as a replica is.
        ``may_read``: False where the cycle has no time left for it (the stretches move on,
        unread)."""
        replays = {**replay_positions(senders, own or {}), **(consumers or {})}
        if current_lsn is None or not replays:
            self._stretches = {}
            return {}
        written = current_lsn - self._last_lsn if self._last_lsn is not None else 0
        self._last_lsn = current_lsn
        ranges = self.plan(replays, current_lsn, int(self.speed.bytes_per_second * budget * BUDGET_SHARE), written > 0)
        if not ranges or not may_read:
            return self.dates()
        located = self._located(ranges, current_lsn + max(0, written))
        asked = time.monotonic()
        self.totals = replace(self.totals, reads=self.totals.reads + 1)
        try:
            read = await self._read(conn, ranges, located, round(budget * 1000))
        except psycopg.errors.QueryCanceled:
            # Slower than the budget (a busy primary, WAL heavy with full-page images): ask
            # for less next time. The session is as it was; the dates are last cycle's.
            asked_bytes = sum((r.end - r.start) // COUNT_FACTOR if located else r.direct_end - r.start for r in ranges)
            # The server's time: the budget.
            self.speed.cancelled(asked_bytes, min(time.monotonic() - asked, budget))
            self.totals = replace(self.totals, cancelled=self.totals.cancelled + 1)
            return self.dates()
        except psycopg.OperationalError:
            raise
        except psycopg.errors.InsufficientPrivilege as exc:
            self.state = False
            note_failure("wal_dating", flat_message(exc))
            return {}
        except psycopg.Error as exc:
            self.state = False
            self.totals = replace(self.totals, failed=self.totals.failed + 1)
            log.debug("%s/primary: reading commit times from %s failed: %s", cluster, format_lsn(ranges[0].start),
                      flat_message(exc))
            return self.dates()
        read_at = time.monotonic()
        self.state = True
        # Timed by the server where it says (a starved lagwatch takes the answer late: its
        # own clock would make the reads seem slow, and the next ones shrink for nothing).
        self.speed.measured(sum(r.described_bytes + r.counted_bytes // COUNT_FACTOR for r in read.reads),
                       read.took if read.took is not None else read_at - asked)
        self.absorb(read, read_at)
        return self.dates()

    def _located(self, ranges: list[LocatedRange], reach: int) -> bool:
        """Whether this cycle's read counts first: only where some range is not read whole
        by describing it (it starts short of a record, or further from ``reach``, where the
        primary will be when the read runs, than it may describe: about a cycle's writing
        past the position it was polled at, before the replicas were waited for). The plain
        statement is the cheaper one to plan, and a replica keeping up needs no more."""
        located = self.locate and self._plain_cycles == 0 and any(
            r.direct_end == r.start or reach > r.direct_end for r in ranges)
        self._plain_cycles = max(0, self._plain_cycles - 1)
        return located

    async def _read(self, conn: psycopg.AsyncConnection[Any], ranges: list[LocatedRange], located: bool,
                    timeout_ms: int) -> CommitReads:
        """The statement's answer. pg_walinspect fails the whole statement when a range
        holds no complete record from its start to the flush (a replica caught up to the
        last whole record while the next is still being written, or to a segment's end
        while the next segment is made): that range is known to hold no commit anyone can
        see yet (a commit is seen once flushed), and the others are read again without it.
        Where the start it names is inside a located range (a chunk began in a record
        longer than GUARD), reads describe from records' starts alone for a while."""
        answered: list[CommitRead] = []
        while True:
            statement = walcommits.locate_statement(ranges, self.max_commits, timeout_ms) if located else \
                walcommits.statement([(r.start, r.direct_end) for r in ranges], self.max_commits, timeout_ms)
            try:
                cursor = await conn.execute(statement)
                cursor.nextset()  # past SET LOCAL's empty result
                read = walcommits.parse(await cursor.fetchall(), self.max_commits)
                return replace(read, reads=read.reads + tuple(answered))
            except psycopg.errors.InternalError as exc:
                after = walcommits.no_record_after(exc)
                if after is None or not (located or any(r.start == after for r in ranges)):
                    raise
                if any(r.start == after for r in ranges):
                    answered.append(CommitRead(after, after, (), complete=True))
                    ranges = [r for r in ranges if r.start != after]
                else:
                    located, self._plain_cycles = False, PLAIN_CYCLES_AFTER_ERROR
                    self._stretches = {name: s for name, s in self._stretches.items() if s.exact}
                    ranges = [r for r in ranges if r.direct_end > r.start]
                self.totals = replace(self.totals, retried=self.totals.retried + 1)
                if not ranges:
                    return CommitReads(None, tuple(answered))



def _moved_on(old: _Stretch | None, replay: int, current_lsn: int) -> _Stretch:
    """A replica's stretch this cycle, its replay position now at ``replay``."""
    if old is None or not old.start <= replay <= old.end or (not old.exact and current_lsn - old.end < GUARD + CHUNK):
        # Afresh from its position (a record's start), also where the stretch ends short of
        # a record near the flush, where a read cannot start.
        return _Stretch(replay, replay, (), replay)
    # From where its walsender stood last cycle, not this one: the replica's own position,
    # read at the same moment, may be a reply behind the walsender's.
    start = min(replay, old.replay)
    return _Stretch(start, old.end, tuple(c for c in old.commits if c[0] >= start), replay, exact=old.exact)


def replay_positions(senders: Sequence[WalSender], own: Mapping[str, int]) -> dict[str, int]:
    """Where to read past, by walsender name: the replica's own replay position of this
    cycle where it came, else the one its walsender last heard (a reply old: a replica
    replaying a big transaction is megabytes further on by then). A replica cut off from
    the primary has no walsender: its own position alone dates it."""
    heard = {s.application_name: s.replay_lsn for s in senders if s.replay_lsn is not None}
    return {**heard, **own}


class DecodeSpeed:
    """What the primary's pg_get_wal_records_info decodes a second, as lagwatch's reads
    measure it (the rule above READS_REMEMBERED): what a read is planned by. Pure."""

    def __init__(self) -> None:
        self.bytes_per_second = INITIAL_SPEED
        self._read_times: deque[float] = deque(maxlen=READS_REMEMBERED)  # seconds each read took

    def measured(self, nbytes: int, seconds: float) -> None:
        """A read of ``nbytes`` that took ``seconds``: its time less the fixed part, if big enough."""
        if seconds <= 0:
            return
        self._read_times.append(seconds)
        if nbytes >= SPEED_READ_BYTES:
            decoding = max(seconds - min(self._read_times), seconds / 2)
            self.bytes_per_second = max(MIN_SPEED, 0.7 * self.bytes_per_second + 0.3 * nbytes / decoding)

    def cancelled(self, asked_bytes: int, seconds: float) -> None:
        """A read the server cancelled at its budget: half what it managed, at most."""
        self.bytes_per_second = max(MIN_SPEED, min(self.bytes_per_second, asked_bytes / max(seconds, 1e-3)) / 2)
