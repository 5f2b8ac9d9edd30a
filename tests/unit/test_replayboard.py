"""The cycle's board of replay positions (replayboard.py) and what the primary's WAL read
takes from it (commitscan.replay_positions): pure asyncio, no server, no wall clock (the
waits that would time out are given no time, or are released by the test)."""

from __future__ import annotations

import asyncio

from lagwatch.commitscan import replay_positions
from lagwatch.replayboard import ReplayBoard
from lagwatch.views.replication import WalSender


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


def test_a_cut_off_replica_is_taken_if_it_has_said_but_not_waited_for() -> None:
    async def cycle() -> dict[str, int]:
        board = ReplayBoard()
        board.expect("r1")
        board.expect("cut")  # still answering, no walsender: not worth the primary's wait
        board.expect("late")
        board.post("cut", 3000)
        board.post("r1", 1000)
        # A timeout it will not need: r1, the only one waited for, has posted.
        return await board.positions({"r1", "cut", "late"}, timeout=3600, wait_for={"r1"})

    assert asyncio.run(cycle()) == {"r1": 1000, "cut": 3000}
