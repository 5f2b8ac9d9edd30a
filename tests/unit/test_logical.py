"""Logical consumers (logical.py, views/replication.parse_all): kept apart from the
replicas, positioned by what they applied or confirmed, dated like a replica."""

from lagwatch.estimate.logical import LogicalConsumers
from lagwatch.estimate.lsnclock import LsnClock, WalDates
from lagwatch.rooms.slots import Slot
from lagwatch.views import replication
from lagwatch.views.replication import LogicalSender, logical_key

MB = 1 << 20


def _row(**over: object) -> dict[str, object]:
    row: dict[str, object] = {
        "pid": 1, "application_name": "replica1", "client_addr": "127.0.0.2", "state": "streaming",
        "sync_state": "async", "sent_lsn": "0/3000000", "write_lsn": "0/3000000", "flush_lsn": "0/3000000",
        "replay_lsn": "0/3000000", "current_lsn": "0/3000000", "write_lag": None, "flush_lag": None,
        "replay_lag": None, "slot_name": "replica1", "slot_type": "physical"}
    row.update(over)
    return row


def test_logical_walsenders_are_consumers_not_replicas() -> None:
    rows = [_row(), _row(pid=2, application_name="sub", slot_name="sub", slot_type="logical", replay_lsn="0/2F00000",
                         flush_lsn="0/2E00000"),
            _row(pid=3, application_name="pg_recvlogical", slot_name="cdc", slot_type="logical", replay_lsn=None,
                 flush_lsn="0/2D00000")]
    senders = replication.parse_all(rows)
    assert [s.application_name for s in senders.physical] == ["replica1"]
    assert replication.parse(rows) == senders.physical
    by_slot = {s.slot_name: s for s in senders.logical}
    assert by_slot["sub"].position == 0x2F00000  # applied: ahead of what its own flush confirmed
    assert by_slot["cdc"].position == 0x2D00000  # no apply position: what it confirmed
    assert logical_key("sub") not in {s.application_name for s in senders.physical}


def _slot(name: str, confirmed: int | None, active: bool = False) -> Slot:
    return Slot(name, "logical", "postgres", "pgoutput", active, False, "reserved", None, 10 * MB, None, None, None,
                None, confirmed_flush_lsn=confirmed)


def _clock(points: list[tuple[int, float]]) -> LsnClock:
    clock = LsnClock(64)
    for lsn, at in points:
        clock.record(lsn, at)
    return clock


def test_a_consumer_is_dated_by_the_first_commit_past_what_it_applied() -> None:
    consumers = LogicalConsumers(interval=0.1, window=10)
    sender = LogicalSender("sub", "sub", "streaming", 0x3000000, 0x3000000, 0x2000000, 0x2800000)
    dates = WalDates(0x2800000, 0x3000000, ((0x2900000, 99.70), (0x2A00000, 99.80)), complete=True)
    (c,) = consumers.update([_slot("sub", 0x2000000, True)], [sender], 0x3000000, _clock([(0x1000000, 90.0)]),
                            {logical_key("sub"): dates}, at=100.0, now=100.01)
    assert (c.consumer, c.active, c.position, c.evidence) == ("sub", True, 0x2800000, "wal_commit")
    assert abs(c.staleness - 0.30) < 1e-9 and c.lag_bytes == 0x800000 and c.window is not None
    # Nothing committed past it, and the read reached the primary's flush: it lacks nothing.
    caught_up = WalDates(0x3000000, 0x3000000, (), complete=True)
    sender = LogicalSender("sub", "sub", "streaming", 0x3000000, 0x3000000, 0x3000000, 0x3000000)
    (c,) = consumers.update([_slot("sub", 0x3000000, True)], [sender], 0x3000000, _clock([(0x1000000, 90.0)]),
                            {logical_key("sub"): caught_up}, at=100.1, now=100.11)
    assert c.staleness == 0.0


def test_a_stopped_consumer_keeps_its_name_and_its_furthest_position_and_grows_stale() -> None:
    consumers = LogicalConsumers(interval=0.1, window=10)
    clock = _clock([(0x1000000, 10.0), (0x2000000, 11.0), (0x3000000, 12.0)])
    sender = LogicalSender("pg_recvlogical", "cdc", "streaming", 0x2000000, 0x2000000, 0x1800000, 0x1F00000)
    consumers.update([_slot("cdc", 0x1800000, True)], [sender], 0x2000000, clock, {}, at=11.0, now=11.0)
    # Gone: its slot confirmed less than it had applied; the furthest is kept.
    first, = consumers.update([_slot("cdc", 0x1800000)], [], 0x3000000, clock, {}, at=12.5, now=12.5)
    later, = consumers.update([_slot("cdc", 0x1800000)], [], 0x3000000, clock, {}, at=14.5, now=14.5)
    assert (first.consumer, first.active, first.position) == ("pg_recvlogical", False, 0x1F00000)
    assert later.staleness is not None and first.staleness is not None
    assert abs((later.staleness - first.staleness) - 2.0) < 1e-9  # one for one with wall time
    # The slot dropped: forgotten, and a new slot of that name starts afresh.
    assert consumers.update([], [], 0x3000000, clock, {}, at=15.0, now=15.0) == ()
    (fresh,) = consumers.update([_slot("cdc", 0x3000000)], [], 0x3000000, clock, {}, at=15.1, now=15.1)
    assert (fresh.consumer, fresh.position, fresh.staleness) == ("cdc", 0x3000000, 0.0)


def test_status_and_the_page_list_consumers_under_their_cluster_apart_from_replicas() -> None:
    from lagwatch.estimate.snapshot import ClusterSnapshot, LogicalConsumer, Snapshot
    from lagwatch.render.text import render_text
    from lagwatch.serve.export import families
    from lagwatch.serve.status import snapshot_status
    from lagwatch.serve.status_page import render

    consumers = (LogicalConsumer("lw_sub", "lw_sub", True, "streaming", "app", "pgoutput", 0x3000000, 4096, 0.012,
                                 "wal_commit", 5.0, None),
                 LogicalConsumer("cdc<x>", "pg_recvlogical", False, None, "app", "test_decoding", 0x2000000, 1 << 24,
                                 42.0, "lsn_clock", 5.0, None))
    cluster = ClusterSnapshot("main", 0x3001000, None, (), None, (), logical=consumers)
    snap = Snapshot(1.0e9, 0.004, 5, 0, (cluster,))
    status = snapshot_status(snap)["clusters"][0]
    assert status["replicas"] == []
    assert [(c["slot"], c["consumer"], c["active"], c["staleness_seconds"]) for c in status["logical_consumers"]] == [
        ("lw_sub", "lw_sub", True, 0.012), ("cdc<x>", "pg_recvlogical", False, 42.0)]
    page = render(snap)
    assert "logical consumers (never in a pool)" in page and "cdc&lt;x&gt;" in page and "not connected" in page
    text = render_text(families(snap)).decode()
    assert 'lagwatch_logical_staleness_seconds{cluster="main",consumer="lw_sub",slot="lw_sub"} 0.012' in text
    assert 'lagwatch_logical_consumer_active{cluster="main",consumer="pg_recvlogical",slot="cdc<x>"} 0.0' in text
    assert "lagwatch_replica_lag_seconds{" not in text
