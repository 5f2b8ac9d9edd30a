"""The vacuum horizon's room (rooms/horizon.py): who holds the primary's horizon back, in
transactions and for how long; its families, /api/status part and /status line. Pure. The
real holders, on real servers: tests/integration/test_vacuum_horizon.py; the transaction ID
clock that dates them: test_xidclock.py."""

from __future__ import annotations

from lagwatch.config.options import ClusterOptions
from lagwatch.estimate.snapshot import ClusterSnapshot, Snapshot
from lagwatch.estimate.xidclock import XidClock
from lagwatch.render.text import render_text
from lagwatch.rooms import horizon, slots
from lagwatch.rooms.base import Cycle
from lagwatch.rooms.horizon import Horizon, VacuumHorizon
from lagwatch.serve.export import families
from lagwatch.serve.status import cluster_status
from lagwatch.serve.status_page import render

OPTIONS = ClusterOptions(name="main", horizon_alert_xids=500)


def slot_row(**kw: object) -> dict[str, object]:
    row: dict[str, object] = {"slot_name": "s", "slot_type": "logical", "database": "db", "plugin": "pgoutput",
                              "active": False, "temporary": False, "wal_status": "reserved", "safe_wal_size": None,
                              "retained_bytes": 10, "confirmed_flush_lag_bytes": 5, "conflicting": False,
                              "inactive_seconds": 3.0, "invalidation_reason": None}
    row.update(kw)
    return row


def test_a_slot_says_the_horizon_it_holds_and_its_safety() -> None:
    (s,) = slots.parse([slot_row(xmin_age=None, catalog_xmin_age=1234, two_phase=True, failover=True, synced=False,
                                 idle_timeout_left=42.5)])
    assert (s.horizon_age, s.two_phase, s.failover, s.synced, s.idle_timeout_left) == (1234, True, True, False, 42.5)
    (old,) = slots.parse([slot_row()])  # an older server's row: none of it known
    assert (old.horizon_age, old.failover, old.idle_timeout_left) == (None, None, None)
    (both,) = slots.parse([slot_row(xmin_age=7, catalog_xmin_age=3)])
    assert both.horizon_age == 7


def test_the_others_are_read_one_poll_in_ten_beside_every_polls_slots() -> None:
    assert horizon.VIEW.every == 10 and horizon.VIEW.keep  # carried between its reads by the poll (test_cadence.py)
    assert horizon.parse([{"held": None}]) == Horizon()
    read = horizon.parse([{"held": {"walsenders": {"replica2": 900}, "sessions": 50, "prepared": None}}])
    assert read == Horizon({"replica2": 900}, 50, None)
    (slot,) = slots.parse([slot_row(slot_name="cdc", catalog_xmin_age=77)])
    assert horizon.holders(read, [slot]) == {"slot/cdc": 77, "replica/replica2": 900, "sessions": 50}
    assert horizon.holders(None, []) == {}  # no primary answer: its slots only (none)


def test_the_keeper_takes_the_leading_primarys_answer_the_cycles_slots_and_dates_them() -> None:
    keeper = horizon.ROOM.keeper()
    (cdc,) = slots.parse([slot_row(slot_name="cdc", catalog_xmin_age=700, held_xid=1000)])
    mine, other = Horizon({"replica2": 30}, 5, None), Horizon({}, 9_999, 9_999)
    clock = XidClock()
    # The primary's clock: 20 transactions a second, read every 10 s. ID 1000 is the next one
    # at t=50, so first seen handed out at t=60: at t=100 held 40 s at least.
    for t in range(0, 101, 10):
        clock.record(20 * t, float(t))
    cycle = Cycle(100.0, OPTIONS, "p1", (cdc,), clock.age)
    value = keeper.update({"p1": mine, "p0": other}, cycle)  # two primaries: the leading one's alone
    assert value == VacuumHorizon({"slot/cdc": 700, "replica/replica2": 30, "sessions": 5}, {"slot/cdc": 40.0}, 500)
    # No primary answered: nothing held is said, the threshold still is (the alert's rule reads it).
    assert keeper.update({"p0": other}, Cycle(101.0, OPTIONS, None)) == VacuumHorizon({}, {}, 500)


def snapshot_with(value: VacuumHorizon | None) -> Snapshot:
    cluster = ClusterSnapshot(name="main", primary_lsn=None, wal_rate_bytes_per_second=None, replicas=(),
                              walinspect=None, nodes=(), rooms={} if value is None else {"horizon": value})
    return Snapshot(1.0, 0.01, 1, 0, (cluster,), interval=1.0, effective_interval=1.0)


def test_exported_shown_and_said_on_the_status_page() -> None:
    value = VacuumHorizon({"slot/cdc": 700, "sessions": 5}, {"slot/cdc": 90.0}, 500)
    text = render_text(families(snapshot_with(value))).decode()
    for line in ('lagwatch_horizon_held_xids{cluster="main",holder="slot/cdc"} 700',
                 'lagwatch_horizon_held_xids{cluster="main",holder="sessions"} 5',
                 'lagwatch_horizon_held_seconds{cluster="main",holder="slot/cdc"} 90.0',
                 'lagwatch_horizon_alert_xids{cluster="main"} 500'):
        assert line in text, line
    assert cluster_status(snapshot_with(value).clusters[0])["horizon"] == {
        "held_xids": {"slot/cdc": 700, "sessions": 5}, "held_seconds": {"slot/cdc": 90.0}, "alert_xids": 500}
    page = render(snapshot_with(value))
    # Oldest first; the one over the cluster's threshold marked.
    assert ('vacuum horizon held by: <span class="warn">slot/cdc 700 xids for 90s+ (over horizon_alert_xids)'
            '</span>; sessions 5 xids</div>') in page, page
    assert "vacuum horizon" not in render(snapshot_with(VacuumHorizon({}, {}, 500)))
