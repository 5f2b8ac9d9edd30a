"""The cycle's board of replay positions (replayboard.py) and what the primary's WAL read
takes from it (extrareads.ExtraReads, commitscan.replay_positions): pure asyncio, no
server, no wall clock (the waits that would time out are given no time, or are released
by the test)."""

from __future__ import annotations

import asyncio
import time

import pytest
from lagwatch.config import ClusterConfig, parse_config
from lagwatch.estimate.clock import PrimaryClock
from lagwatch.estimate.lsnclock import Staleness, date_from_wal
from lagwatch.read.commitscan import replay_positions
from lagwatch.read.extrareads import ExtraReads
from lagwatch.read.replayboard import ReplayBoard
from lagwatch.views.replication import WalSender
from lagwatch.views.walcommits import CommitRead, CommitReads


def _sender(name: str, replay: int | None) -> WalSender:
    return WalSender(name, None, "streaming", "async", None, 10_000, 10_000, 10_000, 10_000, replay, None, None, None)


def test_the_primary_waits_for_the_replicas_that_are_coming_and_takes_what_they_say() -> None:
    async def cycle() -> tuple[dict[str, int], list[str]]:
        board = ReplayBoard()
        board.expect("r1")
        board.expect("r2")
        order = []

        async def replicas() -> None:
            await asyncio.sleep(0)
            board.post("r1", 5000)
            order.append("r1 posted")
            await asyncio.sleep(0)
            board.post("r2", None)  # answered, but said no replay position (not in recovery)
            order.append("r2 posted")

        posting = asyncio.ensure_future(replicas())
        # A timeout it will not need: it returns as soon as both have posted.
        got = await board.positions({"r1", "r2"}, timeout=3600)
        order.append("primary read")
        await posting
        return got, order

    got, order = asyncio.run(cycle())
    assert got == {"r1": 5000}
    assert order == ["r1 posted", "r2 posted", "primary read"]


def test_a_replica_that_does_not_answer_in_time_is_not_waited_for_past_the_timeout() -> None:
    async def cycle() -> dict[str, int]:
        board = ReplayBoard()
        board.expect("r1")
        board.expect("hung")
        board.post("r1", 7000)
        return await board.positions({"r1", "hung"}, timeout=0)

    assert asyncio.run(cycle()) == {"r1": 7000}


def test_only_the_names_asked_for_and_nothing_waited_for_when_nobody_is_coming() -> None:
    async def cycle() -> dict[str, int]:
        board = ReplayBoard()
        board.expect("cascaded")  # polled, but the primary does not stream to it
        board.post("r1", 100)
        return await board.positions({"r1"}, timeout=3600)

    assert asyncio.run(cycle()) == {"r1": 100}


def test_the_read_starts_where_the_replica_says_it_is_else_where_its_walsender_heard() -> None:
    senders = [_sender("r1", 1000), _sender("r2", 2000), _sender("starting", None)]
    # r1 replayed 6 MB past its walsender's last reply: the read starts there; r2 did not
    # answer this cycle: its walsender's position; no replay position at all: nothing.
    assert replay_positions(senders, {"r1": 6_001_000}) == {"r1": 6_001_000, "r2": 2000}
    # A replica cut off from the primary has no walsender: its own position is read past.
    assert replay_positions(senders, {"cut": 3000}) == {"r1": 1000, "r2": 2000, "cut": 3000}


def _cluster(*replicas: str) -> ClusterConfig:
    return parse_config({"clusters": [{
        "name": "main", "primary": {"dsn": "host=p"},
        "replicas": [{"name": name, "dsn": f"host={name}"} for name in replicas]}]}).clusters[0]


# A cluster with a replica the primary streams to (r1) and one cut off from it (cut).
CLUSTER = _cluster("r1", "cut")


def _extras() -> ExtraReads:
    """The primary's extra reads, polled every hour: a wait the test does not release would
    last a quarter of that, so nothing here depends on the host's speed."""
    return ExtraReads(CLUSTER.lag_from_wal_max_bytes, interval=3600.0, query_timeout=3600.0)


def test_a_replica_the_primary_does_not_stream_to_is_waited_for_as_one_it_does() -> None:
    """Its own answer is all that dates a cut-off (or cascaded) replica: the read waits for
    it as it does for a streamed one, within the same budget."""
    async def cycle() -> tuple[bool, dict[str, int]]:
        extras, board = _extras(), ReplayBoard()
        board.expect("r1")
        board.expect("cut")
        read = asyncio.ensure_future(
            extras.replicas_own(CLUSTER, board, [_sender("r1", 900)], time.monotonic() + 3600))
        board.post("r1", 1000)
        for _ in range(50):  # every turn of the loop the read could want to return in
            await asyncio.sleep(0)
        waiting = not read.done()
        board.post("cut", 3000)
        return waiting, await read

    waiting, got = asyncio.run(cycle())
    assert waiting, "the read went ahead with the streamed replica's position alone"
    assert got == {"r1": 1000, "cut": 3000}


def test_a_cut_off_replica_late_for_the_read_is_read_past_from_where_it_said_it_was_last_cycle() -> None:
    """The failure this mends (test_lag_truth's cut-off replica, read by commit timestamps
    cycles after the cut): a replica cut off a little past where its stretch ended, whose
    answers came after the primary's read, was never placed, so its stretch was kept unread
    and nothing past where it stands was ever listed. Its answer of the cycle before, late
    for that cycle's read, places it: the WAL past there is read and dates it."""
    extras = _extras()
    scanner = extras.scanner
    scanner.locate = False
    # Streaming, it stood at 1000; the read listed a commit at 1500 and reached the flush, 1600.
    scanner.plan({"r1": 1000, "cut": 1000}, current_lsn=1600)
    scanner.absorb(CommitReads(100.0, (CommitRead(1000, 1600, ((1500, 99.0),), complete=True),)), read_at=100.0)

    async def cycles() -> tuple[dict[str, int], dict[str, int]]:
        # Then cut off at 2000, past that stretch's end: no walsender now, and its answers
        # come after the primary's read (given no time to wait: its deadline is past).
        first = ReplayBoard()
        first.expect("r1")
        first.expect("cut")
        first.post("r1", 5000)
        own_first = await extras.replicas_own(CLUSTER, first, [_sender("r1", 4000)], time.monotonic())
        first.post("cut", 2000)  # after the read
        second = ReplayBoard()
        second.expect("r1")
        second.expect("cut")
        second.post("r1", 6000)
        own_second = await extras.replicas_own(CLUSTER, second, [_sender("r1", 5000)], time.monotonic())
        second.post("cut", 2000)
        return own_first, own_second

    own_first, own_second = asyncio.run(cycles())
    assert own_first == {"r1": 5000}  # its first answer after the cut came too late: not placed
    assert own_second == {"r1": 6000, "cut": 2000}  # placed by it in the next cycle's read
    # That read starts where it stands (its commit at 1500 is behind it) and finds the
    # first commit it lacks, which dates it.
    ranges = scanner.plan(replay_positions([_sender("r1", 5000)], own_second), current_lsn=9000)
    assert [r.start for r in ranges] == [2000, 6000]
    scanner.absorb(CommitReads(101.0, (CommitRead(2000, 6096, ((2100, 100.2),), complete=False),
                                       CommitRead(6000, 9000, (), complete=True))), read_at=101.0)
    clock = PrimaryClock()
    clock.note_all(scanner.clock_read())  # the reads' clocks: the primary's read 1 s apart
    dated = clock.dated(scanner.dates()["cut"])
    assert dated is not None and date_from_wal(2000, 101.5, dated) == Staleness(pytest.approx(1.3), "wal_commit")


def test_only_last_cycles_answer_stands_in_and_only_for_a_replica_with_no_walsender() -> None:
    """A streamed replica late for the read is placed by its walsender (heard since its last
    answer, so no further behind); an answer two cycles old places nobody."""
    async def cycles() -> list[dict[str, int]]:
        extras, out = _extras(), []
        for posts in ({"r1": 5000, "cut": 2000}, {}, {}):
            board = ReplayBoard()
            board.expect("r1")
            board.expect("cut")
            out.append(await extras.replicas_own(CLUSTER, board, [_sender("r1", 5500)], time.monotonic()))
            for name, lsn in posts.items():  # after the read
                board.post(name, lsn)
        return out

    assert asyncio.run(cycles()) == [{}, {"cut": 2000}, {}]
    assert replay_positions([_sender("r1", 5500)], {"cut": 2000}) == {"r1": 5500, "cut": 2000}
