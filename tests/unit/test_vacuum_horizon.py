"""Who holds the primary's vacuum horizon (views/horizon.py, views/slots.py,
vacuumhorizon.py): pure parsing and keeping. The real holders: tests/integration/test_vacuum_horizon.py."""

from __future__ import annotations

from lagwatch.estimate.vacuumhorizon import HorizonHolders
from lagwatch.views import horizon, slots
from lagwatch.views.horizon import Horizon


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
    assert horizon.VIEW.every == 10  # carried between its reads by the poll (test_cadence.py)
    assert horizon.parse([{"held": None}]) == Horizon()
    read = horizon.parse([{"held": {"walsenders": {"replica2": 900}, "sessions": 50, "prepared": None}}])
    assert read == Horizon({"replica2": 900}, 50, None)
    (slot,) = slots.parse([slot_row(slot_name="cdc", catalog_xmin_age=77)])
    assert HorizonHolders.note(read, [slot]) == {"slot/cdc": 77, "replica/replica2": 900, "sessions": 50}
    # No primary answer: its slots only (none).
    assert HorizonHolders.note(None, []) == {}


def test_a_slots_hold_is_dated_by_the_transaction_id_clock() -> None:
    from lagwatch.estimate.vacuumhorizon import widen

    # 32-bit IDs made 64 against the clock, across a wraparound of the low bits.
    assert widen(100, (5 << 32) + 200) == (5 << 32) + 100
    assert widen(0xFFFF_FFF0, (5 << 32) + 16) == (4 << 32) + 0xFFFF_FFF0
    assert widen(300, (5 << 32) + 200) == (5 << 32) + 200  # a transaction still running: just handed out
    holders = HorizonHolders()
    base = 7 << 32
    (held,) = slots.parse([slot_row(slot_name="cdc", held_xid=base + 1000 - (7 << 32), catalog_xmin_age=1)])
    # The clock: 2 transactions a second, polled every 10 s; the slot holds ID 1000, handed
    # out at t=500: at t=1000 it has held the horizon 500 s, read within one poll of that.
    for t in range(0, 1001, 10):
        dated = holders.dated(base + 2 * t, float(t), [held])
    assert 490.0 <= dated["slot/cdc"] <= 500.0, dated
    assert holders.dated(None, 1001.0, [held]) == {}  # no primary this poll: nothing dated
    # A clock that goes back is another server's (a failover): its IDs are dated afresh.
    fresh = holders.dated(base + 5, 1002.0, [held])
    assert fresh == {"slot/cdc": 0.0}
