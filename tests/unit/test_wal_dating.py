"""Staleness dated from the commits in the primary's WAL (lsnclock.date_from_wal), the stretches
read for them (commitscan.CommitScanner), the statement's answer (views.walcommits), and
the heartbeat's bounds (beats.py): tables, no server. The real servers: tests/integration/test_lag_field.py."""

from __future__ import annotations

import asyncio
import re

import psycopg
import pytest
from lagwatch.estimate.beats import BeatLog, Beats
from lagwatch.estimate.clock import PrimaryClock
from lagwatch.estimate.history import LagHistory, ReplayPosition
from lagwatch.estimate.lsnclock import Commits, Staleness, WalDates, date_from_wal
from lagwatch.lsn import format_lsn
from lagwatch.read.commitscan import ABSENT_CYCLES, COUNT_FACTOR, CommitScanner, DecodeSpeed
from lagwatch.views import walcommits
from lagwatch.views.walcommits import CHUNK, GUARD, OVERLAP, STEP, CommitRead, CommitReads, LocatedRange, WalCommits

# Commits at LSNs 1000, 2000, 3000 made at monotonic 10.0, 10.5, 11.0; read to 3500.
DATES = WalDates(start=900, end=3500, commits=((1000, 10.0), (2000, 10.5), (3000, 11.0)), complete=True)


@pytest.mark.parametrize("replay,at,expected", [
    # The first commit at or past the replay position is the oldest change it lacks.
    (900, 12.0, Staleness(2.0, "wal_commit")),
    (1000, 12.0, Staleness(2.0, "wal_commit")),  # a commit record starting at the replay LSN: not replayed
    (1001, 12.0, Staleness(1.5, "wal_commit")),
    (2500, 12.0, Staleness(1.0, "wal_commit")),
    # Made after the replica was asked: it lacked nothing that existed then.
    (2500, 10.9, Staleness(0.0, "wal_commit")),
    # Past the last commit, the read complete: nothing a reader could see is missing (a
    # transaction still running writes records, not changes anyone sees).
    (3100, 12.0, Staleness(0.0, "wal_commit")),
    (3500, 12.0, Staleness(0.0, "wal_commit")),
    # Past what was read (polled after the read): what the primary had then, it has.
    (3600, 12.0, Staleness(0.0, "wal_commit")),
    # Not covered: before the read began.
    (800, 12.0, None),
])
def test_the_first_commit_past_the_replay_position_dates_the_staleness(replay: int, at: float,
                                                                        expected: Staleness | None) -> None:
    assert date_from_wal(replay, at, DATES) == expected


def test_an_incomplete_read_without_a_commit_past_the_position_says_nothing() -> None:
    capped = WalDates(start=900, end=3500, commits=((1000, 10.0),), complete=False)
    assert date_from_wal(1200, 12.0, capped) is None
    assert date_from_wal(950, 12.0, capped) == Staleness(2.0, "wal_commit")


def test_a_big_transaction_is_bounded_by_where_the_read_stopped() -> None:
    """A replica deep in a big transaction's WAL, the read capped before any commit: the
    first commit it lacks lies past the read, so it was written after the primary was last
    seen short of there. That caps what the LSN clock alone would say (the first byte it
    lacks, written long before anything a reader could see)."""
    history = LagHistory("main", interval=1.0, window=10.0)
    for t in range(11):  # the primary writes 1 MB a second from t=0
        history.record_primary(1_000_000 * (t + 1), float(t), float(t), None)
    capped = WalDates(start=1_500_000, end=7_500_000, commits=(), complete=False)
    reading = history.reading("r1", ReplayPosition(1_500_000, 10.0, "replica", wal=capped), None, 10.0)
    # The clock: the byte after 1.5 MB was first seen at t=1 (9 s ago); the commit lies past
    # 7.5 MB, where the primary was last seen short of it at t=6: at most 4 s.
    assert reading.staleness == pytest.approx(4.0)
    assert (reading.staleness_evidence, reading.staleness_bound) == ("lsn_clock", "wal_read")
    plain = history.reading("r2", ReplayPosition(1_500_000, 10.0, "replica"), None, 10.0)
    assert plain.staleness == pytest.approx(9.0) and plain.staleness_evidence == "lsn_clock"


def test_a_read_that_saw_nothing_past_the_replica_is_floored_by_a_commit_another_replayed() -> None:
    """The WAL read (a late primary poll's, a cycle before the replica's answer) found no
    commit past the replica: 0 as of the read. Another replica has replayed a commit made
    after it that this one lacks: it reads at least that commit's age, held within the time
    since the primary was last seen short of its position."""
    history = LagHistory("main", interval=0.1, window=10.0)
    history.record_primary(1000, 10.0, 10.0, None)
    nothing_past = WalDates(start=1200, end=1200, commits=(), complete=True)
    lacking = history.reading("r1", ReplayPosition(1200, 10.15, "replica", Commits(9.99, 10.05), nothing_past),
                              None, 10.15)
    assert lacking.staleness == pytest.approx(0.10)
    assert (lacking.staleness_evidence, lacking.staleness_bound) == ("wal_commit", "later_commit")
    # Nothing newer replayed anywhere: the read's 0 stands.
    level = history.reading("r2", ReplayPosition(1200, 10.15, "replica", Commits(10.05, 10.05), nothing_past),
                            None, 10.15)
    assert level.staleness == 0.0 and level.staleness_evidence == "wal_commit"
    # A commit found past it dates it: the floor is not needed.
    found = WalDates(start=1200, end=1400, commits=((1300, 10.0),), complete=True)
    dated = history.reading("r3", ReplayPosition(1200, 10.15, "replica", Commits(9.99, 10.05), found), None, 10.15)
    assert dated.staleness == pytest.approx(0.15) and dated.staleness_evidence == "wal_commit"


def test_past_a_primary_seen_over_an_interval_before_the_replica_its_last_reading_stands() -> None:
    """The primary's answer taken a cycle late (its poll outlasted its cycle on a busy host):
    a replica past where it was seen reads 0 from what lagwatch knows, which is nothing
    of what the primary wrote since. Its last reading stands (same value, same instant, no
    window sample) until the primary is seen again in time; a commit found past it in the
    WAL still dates it."""
    history = LagHistory("main", interval=0.1, window=10.0)
    history.record_primary(1000, 10.0, 10.0, None)
    behind = history.reading("r1", ReplayPosition(900, 10.05, "replica"), None, 10.05)
    assert behind.staleness == pytest.approx(0.05) and behind.staleness_at == 10.05
    stood = history.reading("r1", ReplayPosition(1200, 10.15, "replica"), None, 10.15)
    assert (stood.staleness, stood.staleness_at, stood.staleness_evidence) == \
        (behind.staleness, 10.05, behind.staleness_evidence)
    assert stood.window is not None and stood.window.count == 1
    nothing_past = WalDates(start=1200, end=1200, commits=(), complete=True)
    assert history.reading("r1", ReplayPosition(1200, 10.15, "replica", wal=nothing_past), None,
                           10.15).staleness_at == 10.05
    found = WalDates(start=1200, end=1400, commits=((1300, 10.1),), complete=True)
    dated = history.reading("r1", ReplayPosition(1200, 10.16, "replica", wal=found), None, 10.16)
    assert dated.staleness == pytest.approx(0.06) and dated.staleness_at == 10.16
    # The primary seen in time again: caught up is a reading.
    history.record_primary(1400, 10.2, 10.2, None)
    fresh = history.reading("r1", ReplayPosition(1400, 10.25, "replica"), None, 10.25)
    assert (fresh.staleness, fresh.staleness_evidence, fresh.staleness_at) == (0.0, "caught_up", 10.25)


def _read(*reads: CommitRead, clock_epoch: float = 1000.0) -> CommitReads:
    return CommitReads(clock_epoch, tuple(reads))


def _plain(ranges: list[LocatedRange]) -> list[tuple[int, int]]:
    return [(r.start, r.direct_end) for r in ranges]


def test_the_scanner_reads_past_each_replay_position_once_and_goes_on_from_where_it_stopped() -> None:
    scanner = CommitScanner(max_bytes=4096, max_commits=1, locate=False)
    # Two replicas at the same place: one range; a third elsewhere: its own.
    assert _plain(scanner.plan({"r1": 1000, "r2": 1000, "r3": 50_000}, current_lsn=60_000)) == [
        (1000, 5096), (50_000, 54_096)]
    scanner.absorb(_read(CommitRead(1000, 5096, (), complete=False),
                         CommitRead(50_000, 54_096, ((51_000, 999.5),), complete=False)), read_at=100.0)
    dates = scanner.dates()
    assert dates["r1"] == WalCommits(1000, 5096, (), complete=False)
    # The commit's time is the primary's; the read's clock is kept for the one converter
    # (estimate/clock.PrimaryClock): 0.5 s before the primary read its clock, answered at 100.0.
    assert dates["r3"].commits == ((51_000, 999.5),)
    assert scanner.clock_read() == ((1000.0, 100.0),) and scanner.clock_read() == ()
    clock = PrimaryClock()
    clock.note_all(((1000.0, 100.0),))
    assert clock.dated(dates["r3"]) == WalDates(50_000, 54_096, ((51_000, 99.5),), complete=False)
    # Next cycle: r1 and r2 go on from where they stopped; r3 has its commit: nothing to read.
    assert _plain(scanner.plan({"r1": 1200, "r2": 1000, "r3": 50_500}, current_lsn=61_000)) == [(5096, 9192)]
    # r3 replayed past its commit: its stretch reads on from its end, and keeps the commit
    # a cycle more (from where its walsender stood last cycle: the replica's own position,
    # which dates it, may be a reply behind).
    assert _plain(scanner.plan({"r1": 1200, "r2": 1000, "r3": 51_100}, current_lsn=61_000)) == [
        (5096, 9192), (54_096, 58_192)]
    assert scanner.dates()["r3"].commits == ((51_000, 999.5),)
    # A walsender that went away is forgotten; one that went back (a restart from an older
    # position) starts afresh there.
    assert _plain(scanner.plan({"r1": 900}, current_lsn=61_000)) == [(900, 4996)]
    # Nothing at all when everyone has replayed all the primary had; but while it writes,
    # a replica whose answer came after the primary's is read past (up to the live flush).
    assert scanner.plan({"r1": 61_000}, current_lsn=61_000) == []
    assert _plain(scanner.plan({"r1": 61_000}, current_lsn=61_000, writing=True)) == [(61_000, 65_096)]


def test_a_stretch_whose_replica_is_not_heard_from_is_kept_unread_for_a_while() -> None:
    scanner = CommitScanner(max_bytes=4096, max_commits=1, locate=False)
    scanner.plan({"r1": 1000, "cut": 20_000}, current_lsn=60_000)
    scanner.absorb(_read(CommitRead(1000, 5096, ((2000, 99.0),), complete=False),
                         CommitRead(20_000, 24_096, ((21_000, 99.5),), complete=False)), read_at=100.0)
    read = scanner.dates()["cut"].commits
    # The cut-off replica's position is not known this cycle (it said nothing in time this
    # cycle nor the last: extrareads.py): what was read past it still dates it, and is not
    # read again.
    for _ in range(ABSENT_CYCLES):
        assert scanner.plan({"r1": 1000}, current_lsn=61_000) == []
        assert scanner.dates()["cut"].commits == read
        assert not scanner.dates()["cut"].complete
    # Heard from again: its stretch goes on as before.
    assert scanner.plan({"r1": 1000, "cut": 20_000}, current_lsn=61_000) == []
    assert scanner.dates()["cut"].commits == read
    # Gone for longer: forgotten.
    for _ in range(ABSENT_CYCLES + 1):
        scanner.plan({"r1": 1000}, current_lsn=61_000)
    assert "cut" not in scanner.dates()


def test_the_reads_go_as_far_as_the_budget_decodes() -> None:
    scanner = CommitScanner(max_bytes=1 << 20, locate=False)
    # Two places, 40 kB of budget: shared alike, never under 8 kB, never over max_bytes.
    assert _plain(scanner.plan({"r1": 0, "r2": 500_000}, current_lsn=10**9, budget_bytes=40_960)) == [
        (0, 20_480), (500_000, 520_480)]
    assert _plain(scanner.plan({"r1": 0, "r2": 500_000}, current_lsn=10**9, budget_bytes=1000)) == [
        (0, 8192), (500_000, 508_192)]
    assert _plain(scanner.plan({"r1": 0}, current_lsn=10**9, budget_bytes=10**9)) == [(0, 1 << 20)]
    # Located, the same budget describes as much and counts COUNT_FACTOR times as far
    # (never past max_bytes).
    scanner.locate = True
    assert scanner.plan({"r1": 0, "r2": 500_000}, current_lsn=10**9, budget_bytes=40_960) == [
        LocatedRange(0, 20_480 * COUNT_FACTOR, 20_480), LocatedRange(500_000, 500_000 + 20_480 * COUNT_FACTOR,
                                                                     520_480)]
    assert scanner.plan({"r1": 0}, current_lsn=10**9, budget_bytes=10**9) == [LocatedRange(0, 1 << 20, 1 << 20)]
    # A read the server cancelled at its budget halves the speed it is planned with.
    speed = DecodeSpeed()
    before = speed.bytes_per_second
    speed.cancelled(1_000_000, 0.05)
    assert speed.bytes_per_second == pytest.approx(min(before, 20e6) / 2)
    # A small read (a replica keeping up) says what a read costs whatever its size, not
    # the decoding speed: that stays.
    halved = speed.bytes_per_second
    speed.measured(4_000, 0.002)
    assert speed.bytes_per_second == halved
    # A big read's time, less that fixed part, is its decoding: the speed follows it.
    speed.measured(10_000_000, 0.102)
    assert speed.bytes_per_second == pytest.approx(0.7 * halved + 0.3 * 100e6)
    # Never more than twice what its whole time says.
    speed.measured(100_000, 0.003)
    assert speed.bytes_per_second == pytest.approx(0.7 * (0.7 * halved + 0.3 * 100e6) + 0.3 * 100_000 / 0.0015)

def test_a_stretch_keeps_at_most_max_commits_and_reads_on_only_once_the_replica_is_past_them() -> None:
    scanner = CommitScanner(max_bytes=10_000, max_commits=2, locate=False)
    assert _plain(scanner.plan({"r1": 0}, current_lsn=10_000)) == [(0, 10_000)]  # max_bytes: 10,000
    scanner.absorb(_read(CommitRead(0, 1500, ((100, 1000.0), (200, 1000.1), (300, 1000.2)), complete=True)),
                   read_at=50.0)
    dates = scanner.dates()["r1"]
    # The third commit not kept: the stretch ends where it starts, and is not complete.
    assert dates.end == 300 and len(dates.commits) == 2 and not dates.complete
    # A commit past the replica's position: that dates it, nothing more is read.
    assert scanner.plan({"r1": 50}, current_lsn=10_000) == []
    assert scanner.plan({"r1": 150}, current_lsn=10_000) == []
    # Past both (and its walsender past the first a cycle before): read on from the end.
    assert _plain(scanner.plan({"r1": 250}, current_lsn=10_000)) == [(300, 10_300)]


def test_a_counted_read_ends_short_of_a_record_and_the_next_read_counts_from_there() -> None:
    scanner = CommitScanner(max_bytes=1 << 20)
    assert scanner.plan({"r1": 0}, current_lsn=10**7, budget_bytes=16_384) == [
        LocatedRange(0, 16_384 * COUNT_FACTOR, 16_384)]
    # Counted to 98,304 and nothing whole described there: known up to OVERLAP short of it.
    scanner.absorb(_read(CommitRead(0, 96_256, (), complete=False, exact=False)), read_at=1.0)
    # Read on from there, counted only: no record is known to start there.
    assert scanner.plan({"r1": 10}, current_lsn=10**7, budget_bytes=16_384) == [
        LocatedRange(96_256, 96_256 + 16_384 * COUNT_FACTOR, 96_256)]
    # A read that got nowhere keeps that; near the flush (where a read may not start short
    # of a record) the stretch starts afresh at the replica's position, a record's start.
    scanner.absorb(_read(CommitRead(96_256, 96_256, (), complete=False)), read_at=2.0)
    assert scanner.plan({"r1": 10}, current_lsn=96_256 + GUARD + CHUNK + 1, budget_bytes=16_384)[0].direct_end == \
        96_256
    assert scanner.plan({"r1": 10}, current_lsn=96_256 + GUARD, budget_bytes=16_384) == [
        LocatedRange(10, 10 + 16_384 * COUNT_FACTOR, 10 + 16_384)]


def test_the_statements_answer_is_parsed_and_capped() -> None:
    row = {"clock_epoch": 1000.25, "reads": [
        ["0/1000", "0/2000", [["0/1100", 999.0], ["0/1200", 999.1], ["0/1300", 999.2]], "0/2000"],
        ["0/3000", None, None, "0/5000"],  # nothing whole in the range
        ["0/4000", "0/4800", None, "0/4800"],  # read to the flush: complete
    ]}
    parsed = walcommits.parse([row], max_commits=2)
    assert parsed.clock_epoch == 1000.25 and parsed.took is None
    assert walcommits.parse([{**row, "took": 0.004}], max_commits=2).took == 0.004
    # Three listed, two kept: the stretch ends where the first one not kept starts.
    assert parsed.reads[0] == CommitRead(0x1000, 0x1300, ((0x1100, 999.0), (0x1200, 999.1)), complete=False,
                                         described_bytes=0x1000)
    assert parsed.reads[1] == CommitRead(0x3000, 0x3000, (), complete=False)
    assert parsed.reads[2] == CommitRead(0x4000, 0x4800, (), complete=True, described_bytes=0x800)


def test_a_located_reads_answer_says_what_was_counted_and_what_described() -> None:
    start = 0x100000
    row = {"clock_epoch": 1000.0, "reads": [
        # Read whole (the flush within what may be described): as the plain read.
        [format_lsn(start), format_lsn(start + 0x800), None, format_lsn(start + 0x800), None,
         format_lsn(start - 1), True],
        # Chunks 0-2 counted, the third held a commit and was described.
        [format_lsn(start), format_lsn(start + 2 * STEP + 5000), [[format_lsn(start + 2 * STEP + 100), 999.0]],
         format_lsn(start + 10**7), 2, format_lsn(start + 10**6), False],
        # Counted to the limit, no commit; the last chunk described to where its last record ends.
        [format_lsn(start), format_lsn(start + 10**6 - 40), None, format_lsn(start + 10**7), None,
         format_lsn(start + 10**6), False],
        # Counted to the limit, no record ended in the last chunk: known OVERLAP short of it.
        [format_lsn(start), None, None, format_lsn(start + 10**7), None, format_lsn(start + 10**6), False],
    ]}
    direct, located, counted, unended = walcommits.parse([row], max_commits=8).reads
    assert direct == CommitRead(start, start + 0x800, (), complete=True, described_bytes=0x800)
    assert located == CommitRead(start, start + 2 * STEP + 5000, ((start + 2 * STEP + 100, 999.0),), complete=False,
                                 counted_bytes=2 * STEP + CHUNK, described_bytes=5000)
    assert counted == CommitRead(start, start + 10**6 - 40, (), complete=False, counted_bytes=10**6,
                                 described_bytes=CHUNK - 40)
    assert unended == CommitRead(start, start + 10**6 - OVERLAP, (), complete=False, exact=False,
                                 counted_bytes=10**6, described_bytes=CHUNK)


# -- the heartbeat's bounds (beats.py) ------------------------------------------------------

def _beats() -> Beats:
    log = BeatLog(max_beats=8)
    for seq in range(10, 15):  # a beat every 25 ms from t=100.000, each taking 2 ms
        sent = 100.0 + (seq - 10) * 0.025
        log.add(seq, sent, sent + 0.002)
    return log.snapshot()


@pytest.mark.parametrize("replayed,at,expected", [
    # Shows beat 12 (sent 100.050), lacks 13 (done 100.077): at 100.2 between 123 and 150 ms.
    (12, 100.2, (pytest.approx(0.123), pytest.approx(0.150))),
    # The next beat not yet made when it was read: no lower bound beyond 0.
    (14, 100.101, (0.0, pytest.approx(0.001))),
    # Older than the log: it lacks every beat remembered, the oldest made by 100.002.
    (3, 100.5, (pytest.approx(0.498), None)),
])
def test_the_heartbeat_bounds_the_staleness_within_a_beat(replayed: int, at: float, expected: object) -> None:
    assert _beats().bounds(replayed, at) == expected


def test_a_beat_the_log_cannot_place_says_nothing() -> None:
    assert _beats().bounds(99, 100.5) is None  # newer than any this writer made: another writer's
    assert BeatLog().snapshot().bounds(1, 1.0) is None
    log = BeatLog(max_beats=4)
    for seq in range(1, 10):
        log.add(seq, float(seq), float(seq) + 0.001)
    assert log.snapshot().seq == (7, 8, 9)  # bounded: the older half goes when it is full
    log.add(3, 20.0, 20.001)  # the count went back (a restored primary): afresh
    assert log.snapshot().seq == (3,)


def test_a_reading_outside_the_heartbeats_bounds_is_held_to_them() -> None:
    history = LagHistory("main", interval=1.0, window=10.0)
    for t in range(11):
        history.record_primary(1_000_000 * (t + 1), float(t), float(t), None)
    # The clock alone: the byte after 1.5 MB first seen at t=1: 9 s at t=10.
    high = history.reading("r1", ReplayPosition(1_500_000, 10.0, "replica", beat=(0.1, 0.2)), None, 10.0)
    assert (high.staleness, high.staleness_evidence, high.staleness_bound) == (0.2, "lsn_clock",
                                                                                       "heartbeat_upper")
    low = history.reading("r2", ReplayPosition(1_500_000, 10.0, "replica", beat=(9.5, 9.6)), None, 10.0)
    assert (low.staleness, low.staleness_bound) == (9.5, "heartbeat_lower")
    inside = history.reading("r3", ReplayPosition(1_500_000, 10.0, "replica", beat=(8.0, None)), None, 10.0)
    assert (inside.staleness_evidence, inside.staleness_bound) == ("lsn_clock", None)


def test_the_commits_it_has_replayed_cap_what_the_clock_says() -> None:
    """The read did not reach past its position (it replays faster than lagwatch may read),
    but it did list commits short of it: it has them, so what it lacks was made after the
    last of them."""
    history = LagHistory("main", interval=1.0, window=10.0)
    for t in range(11):
        history.record_primary(1_000_000 * (t + 1), float(t), float(t), None)
    behind = WalDates(start=1_400_000, end=1_450_000, commits=((1_420_000, 9.7),), complete=False)
    reading = history.reading("r1", ReplayPosition(1_500_000, 10.0, "replica", wal=behind), None, 10.0)
    assert reading.staleness == pytest.approx(0.3)
    assert (reading.staleness_evidence, reading.staleness_bound) == ("lsn_clock", "wal_read")


def test_a_commit_written_late_dates_from_the_commits_written_before_it() -> None:
    """On a primary busy writing WAL a commit's record can land well after its timestamp, and
    after commits stamped later: a reader sees none of it before those, so it dates from
    the latest of them (an over-read otherwise: the replica lacks nothing that old)."""
    inverted = WalDates(start=0, end=5000, commits=((1000, 10.50), (2000, 10.44), (3000, 10.55)), complete=True)
    assert date_from_wal(1500, 11.0, inverted) == Staleness(pytest.approx(0.50), "wal_commit")  # not 0.56
    assert date_from_wal(500, 11.0, inverted) == Staleness(pytest.approx(0.50), "wal_commit")
    # And from the last commit the replica itself has replayed, wherever that lies.
    assert date_from_wal(1500, 11.0, inverted, replayed_at=10.8) == Staleness(pytest.approx(0.20), "wal_commit")


def test_the_primarys_clock_is_the_quickest_answers_over_a_window() -> None:
    """estimate/clock.PrimaryClock, the one converter: lagwatch's clock less the primary's
    is the least of ``answered - clock_epoch`` over the last 10 s of answers (never less
    than the truth: a converted instant is never earlier than it was)."""
    clock = PrimaryClock()
    assert clock.offset is None and clock.monotonic(1000.0) is None
    # The primary's clock reads 1000.0 at monotonic 50.0: each answer came a little after.
    clock.note(1000.0, 50.004)
    assert clock.offset == pytest.approx(-949.996)
    clock.note(1001.0, 51.030)  # a late answer (busy host): not taken
    assert clock.offset == pytest.approx(-949.996)
    clock.note_all(((1002.0, 52.001),))  # a quicker one is, a WAL read's as a poll's
    assert clock.offset == pytest.approx(-949.999)
    clock.note(1020.0, 70.020)  # the window moved on
    assert clock.offset == pytest.approx(-949.980)
    assert clock.monotonic(1019.5) == pytest.approx(69.52)
    # A standby cluster's: as of its leader's last replayed commit, one poll at a time.
    clock.standby(1019.0, 70.5)
    assert clock.offset == pytest.approx(-948.5)
    # Every poll of the scanner keeps the clocks its reads took for it.
    scanner = CommitScanner(max_bytes=1 << 20)
    asyncio.run(scanner.scan(_Answers(set()), (), 0x1000, "c", 0.1, lambda *a: None))  # type: ignore[arg-type]
    assert scanner.dates() == {} and scanner.clock_read() == ()


def test_the_heartbeat_config_says_what_is_wrong_and_where() -> None:
    from lagwatch.config import parse_config
    from lagwatch.errors import ConfigError

    cluster = {"name": "m", "primary": {"dsn": "host=a"}}
    assert parse_config({"clusters": [cluster]}).clusters[0].heartbeat is None  # off unless configured
    on = parse_config({"clusters": [{**cluster, "heartbeat": {}}]}).clusters[0].heartbeat
    assert on is not None and (on.interval, on.table, on.id) == (0.025, "lagwatch_heartbeat", None)
    with pytest.raises(ConfigError) as problems:
        parse_config({"clusters": [{**cluster, "heartbeat": {"interval": "1ms", "table": "x; DROP", "id": "a b"}}]})
    text = str(problems.value)
    assert "clusters[0].heartbeat.interval: must be between 5ms and 10s" in text
    assert "clusters[0].heartbeat.table: must be a lower-case table name" in text
    assert "clusters[0].heartbeat.id: must be 1 to 63 letters" in text


class _Answers:
    """A primary's connection that fails each statement naming a start in ``fail_after``
    (as pg_walinspect does where no whole record follows it) and answers the rest."""

    def __init__(self, fail_after: set[int]) -> None:
        self.fail_after = fail_after
        self.other = False  # fail every statement with another error
        self.statements: list[bytes] = []

    async def execute(self, statement: bytes) -> _Answers:
        self.statements.append(statement)
        if self.other:
            raise psycopg.errors.InternalError("out of memory")
        for lsn in sorted(self.fail_after):
            if f"'{format_lsn(lsn)}'".encode() in statement:
                raise psycopg.errors.InternalError(f"could not find a valid record after {format_lsn(lsn)}")
        starts = [int(x.split("/")[0], 16) << 32 | int(x.split("/")[1], 16)
                  for x in re.findall(rb"ARRAY\[([^\]]*)\]::pg_lsn\[\]", statement)[0].decode().replace("'", "")
                  .split(",")]
        self._rows = [{"clock_epoch": 1000.0, "reads": [
            [format_lsn(s), format_lsn(s + 100), [[format_lsn(s + 50), 999.0]], format_lsn(s + 10**6)]
            for s in starts]}]
        return self

    def nextset(self) -> None:
        pass

    async def fetchall(self) -> list[dict[str, object]]:
        return self._rows


def test_a_range_with_no_whole_record_past_it_holds_nothing_visible_and_the_rest_are_read_again() -> None:
    scanner = CommitScanner(max_bytes=1 << 20, locate=False)
    conn = _Answers(fail_after={0x5000})
    failures: list[str] = []
    dates = asyncio.run(scanner.scan(conn, (), 0x10_0000, "c", 0.1, lambda *a: failures.append(a[1]),  # type: ignore[arg-type]
                                     consumers={"r1": 0x5000, "r2": 0x9000}))
    assert len(conn.statements) == 2 and b"'0/5000'" not in conn.statements[1]
    # r1 caught up to the last whole record: nothing a reader can see lies past it.
    assert date_from_wal(0x5000, 10.0, dates["r1"]) == Staleness(0.0, "wal_commit")
    assert dates["r2"].commits and scanner.totals.retried == 1 and scanner.totals.failed == 0 and not failures
    # Any other failure: the cycle's dates are the last ones, counted as failed.
    conn.fail_after, conn.other = set(), True
    again = asyncio.run(scanner.scan(conn, (), 0x10_0000, "c", 0.1, lambda *a: None,  # type: ignore[arg-type]
                                     consumers={"r1": 0x5000, "r2": 0x9000}))
    assert again["r2"].commits == dates["r2"].commits and scanner.totals.failed == 1 and scanner.state is False


def test_a_read_counts_first_where_the_primary_will_have_written_past_what_it_may_describe() -> None:
    # Each read may describe 300 kB (10 MB/s x 0.1 s x BUDGET_SHARE); every statement fails
    # here (only which statement is asked matters).
    scanner = CommitScanner(max_bytes=1 << 20, locate=True)
    conn = _Answers(set())
    conn.other = True

    def scan(current_lsn: int) -> bytes:
        asyncio.run(scanner.scan(conn, (), current_lsn, "c", 0.1, lambda *a: None,  # type: ignore[arg-type]
                                 consumers={"r1": 0x10000}))
        return conn.statements[-1]

    assert b"pg_get_wal_stats" not in scan(0x10000 + 10_000)  # within what a read describes
    # 190 kB written since: by the time the read runs (the replicas waited for) the primary
    # is about as far again, past what describing reaches: counted first.
    assert b"pg_get_wal_stats" in scan(0x10000 + 200_000)
    assert b"pg_get_wal_stats" not in scan(0x10000 + 200_000)  # idle since


class _SlowToAnswer:
    """A primary that describes 1 MB past each start in 10 ms of its own time, its answer
    taken 200 ms later (lagwatch starved of CPU)."""

    def __init__(self) -> None:
        self.statements: list[bytes] = []

    async def execute(self, statement: bytes) -> _SlowToAnswer:
        self.statements.append(statement)
        await asyncio.sleep(0.2)
        return self

    def nextset(self) -> None:
        pass

    async def fetchall(self) -> list[dict[str, object]]:
        return [{"clock_epoch": 1000.0, "took": 0.01, "reads": [["0/100000", "0/1F4240", None, "1/0"]]}]


def test_the_reads_speed_is_the_servers_not_what_a_starved_lagwatch_waited() -> None:
    scanner = CommitScanner(max_bytes=1 << 30, locate=False)
    conn = _SlowToAnswer()
    for _ in range(2):
        asyncio.run(scanner.scan(conn, (), 1 << 32, "c", 0.1, lambda *a: None,  # type: ignore[arg-type]
                                 consumers={"r1": 0x100000}))
    # 1 MB in the server's 10 ms (half of it taken for the read's fixed part: 200 MB/s
    # sampled): the next read is planned for more than the 10 MB/s guessed before any,
    # not for the 5 MB/s lagwatch's own wait would say.
    ends = re.findall(rb"ARRAY\[([^\]]*)\]::pg_lsn\[\]", conn.statements[-1])[1].decode().strip("'").split("/")
    planned = (int(ends[0], 16) << 32 | int(ends[1], 16)) - 0x1F4240
    assert planned > 0.1 * 0.3 * 50e6, planned


def test_departed_replicas_are_kept_one_window_and_at_most_departed_kept() -> None:
    """A replica gone from the output keeps its history one window (it may come back), but
    only the DEPARTED_KEPT last gone do: a Patroni renaming 40 members at once leaves 32."""
    from lagwatch.estimate.history import DEPARTED_KEPT

    history = LagHistory("main", interval=1.0, window=10.0)
    names = [f"m{i:02d}" for i in range(40)]
    for i, name in enumerate(names):
        history.reading(name, None, None, now=100.0 + i * 0.01)  # m39 seen last
    assert history.forget_vanished(set(names), now=101.0) == []
    forgotten = history.forget_vanished({"other"}, now=101.0)
    assert forgotten == names[:40 - DEPARTED_KEPT]  # the longest gone first
    assert history.forget_vanished({"other"}, now=105.0) == []  # the rest within their window
    assert sorted(history.forget_vanished({"other"}, now=120.0)) == names[40 - DEPARTED_KEPT:]
