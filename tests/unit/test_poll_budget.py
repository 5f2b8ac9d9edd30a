"""A cycle waits for its nodes only so long: a slow node's poll goes on in the
background and a later cycle takes its answer (no real server: the poll is replaced)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from lagwatch.config import parse_config
from lagwatch.estimate.snapshot import NodeObservation
from lagwatch.read.poll import NodePoller, poll_all

CONFIG = parse_config({"interval": "100ms", "clusters": [{
    "name": "main", "primary": {"dsn": "host=p"}, "replicas": [{"name": "replica1", "dsn": "host=r1"}]}]})


class FakePoller(NodePoller):
    """Answers when the test says so (``release``), not after a time: what the cycle does
    with an answer that is not in yet is shown without depending on the host's speed."""

    def __init__(self, node: str, *, answers_at_once: bool) -> None:
        cluster = CONFIG.clusters[0]
        super().__init__(cluster, node, "primary" if node == "primary" else "replica",
                         cluster.primary if node == "primary" else cluster.replicas[0], CONFIG)
        self.answers_at_once = answers_at_once
        self.gate = asyncio.Event()
        self.started = 0
        self.running = self.most_running = 0

    def release(self) -> None:
        self.gate.set()

    async def poll(self, board: object = None) -> NodeObservation:
        self.started += 1
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        if not self.answers_at_once:
            await self.gate.wait()
            self.gate = asyncio.Event()  # the next poll waits for the next release
        self.running -= 1
        return NodeObservation(cluster="main", node=self.node, role=self.role, observed_at=0.0, duration=0.0)


def test_a_slow_node_costs_the_others_nothing_and_is_taken_later() -> None:
    async def cycles() -> list[list[NodeObservation]]:
        fast, slow = FakePoller("primary", answers_at_once=True), FakePoller("replica1", answers_at_once=False)
        out = []
        for cycle in range(5):
            # The cycle ends at its budget with the slow node's answer not in (it is
            # released only between cycles): had it waited for it, it would never end.
            out.append(await poll_all([fast, slow], CONFIG.cycle_budget))
            if cycle % 2 == 0:
                slow.release()  # its answer comes in between this cycle and the next
                while slow.running:
                    await asyncio.sleep(0)
        assert fast.started == 5
        assert slow.most_running == 1  # one poll at a time, never stacked
        await slow.close()
        return out

    results = asyncio.run(cycles())
    assert abs(CONFIG.cycle_budget - 0.08) < 1e-9
    assert all(r[0].ok for r in results)
    # Each slow answer is taken by the cycle after the one that started it.
    assert [r[1].ok for r in results] == [False, True, False, True, False]
    # Not in yet, and no evidence either way: the first poll is a first connection, and
    # the later ones have no statement under way whose silence lagwatch could have heard.
    assert [r[1].pending for r in results] == ["connecting", None, "late", None, "late"]
    assert all(r[1].error_kind is None for r in results)


def test_reconnects_back_off_with_jitter_so_a_fleet_does_not_come_back_in_step() -> None:
    from lagwatch.read.poll import reconnect_delay

    assert reconnect_delay(1, 1.0, 5.0) == 0.0  # the first retry is at once
    # Then 1, 2, 4, 5 (the cap) intervals, each drawn between half and all of that.
    for failures, ceiling in ((2, 1.0), (3, 2.0), (4, 4.0), (5, 5.0), (9, 5.0)):
        assert reconnect_delay(failures, 1.0, 5.0, draw=0.0) == ceiling / 2
        assert reconnect_delay(failures, 1.0, 5.0, draw=1.0) == ceiling
    spread = {round(reconnect_delay(4, 1.0, 5.0), 3) for _ in range(200)}
    assert len(spread) > 100 and min(spread) >= 2.0 and max(spread) <= 4.0


def test_what_compression_savings_need_is_said_once_where_it_is_missing(caplog: pytest.LogCaptureFixture) -> None:
    """Before PostgreSQL 16 there is no pg_get_wal_block_info: one INFO line. On 16+ without
    EXECUTE on it: one WARNING naming the grant. With it: nothing."""
    from lagwatch.views.probe import Capabilities

    def said(caps: Capabilities) -> list[tuple[int, str]]:
        caplog.clear()
        poller = NodePoller(CONFIG.clusters[0], "primary", "primary", CONFIG.clusters[0].primary, CONFIG)
        poller.say_skipped(caps)
        poller.say_skipped(caps)  # once per connection, however often asked
        return [(r.levelno, r.getMessage()) for r in caplog.records if "compression" in r.getMessage().lower()]

    base = dict(in_recovery=False, has_walinspect=True, can_walinspect=True,
                can_read_all_stats=True)
    caplog.set_level(logging.INFO, logger="lagwatch")
    old = said(Capabilities(version_num=150004, can_walinspect_blocks=False, **base))
    assert [level for level, _ in old] == [logging.INFO] and "PostgreSQL 15 has no pg_get_wal_block_info" in old[0][1]
    denied = said(Capabilities(version_num=180001, can_walinspect_blocks=False, **base))
    assert [level for level, _ in denied] == [logging.WARNING]
    assert "GRANT EXECUTE ON FUNCTION pg_get_wal_block_info(pg_lsn, pg_lsn, boolean)" in denied[0][1]
    assert said(Capabilities(version_num=180001, can_walinspect_blocks=True, **base)) == []


def test_the_primarys_extra_reads_take_at_most_the_time_left_in_the_cycle() -> None:
    """Each extra read (extrareads.py) gets a quarter of the interval at most (the query
    timeout being longer), and no more than what is left before the cycle stops waiting
    for the poll; with under MIN_EXTRA left it is not made."""
    import time

    from lagwatch.read.extrareads import MIN_EXTRA, ExtraReads

    extras = ExtraReads(CONFIG.clusters[0].lag_from_wal_max_bytes, CONFIG.interval, CONFIG.effective_query_timeout)
    now = time.monotonic()
    assert extras.budget(now + 10.0) == pytest.approx(CONFIG.interval / 4)
    assert extras.budget(now + 0.015) == pytest.approx(0.015, abs=0.002)
    assert extras.budget(now + 0.004) < MIN_EXTRA
