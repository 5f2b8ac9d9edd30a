"""The primary's transaction ID clock (estimate/xidclock.py): when it passed an ID. Pure."""

from __future__ import annotations

from lagwatch.estimate.xidclock import XidClock, widen


def test_32_bit_ids_are_made_64_against_the_clock() -> None:
    # Across a wraparound of the low bits.
    assert widen(100, (5 << 32) + 200) == (5 << 32) + 100
    assert widen(0xFFFF_FFF0, (5 << 32) + 16) == (4 << 32) + 0xFFFF_FFF0
    assert widen(300, (5 << 32) + 200) == (5 << 32) + 200  # a transaction still running: just handed out


def test_a_held_id_is_dated_by_the_first_poll_past_it_and_a_clock_going_back_starts_afresh() -> None:
    clock, base = XidClock(), 7 << 32
    assert clock.age(1000) is None  # never read
    # 2 transactions a second, polled every 10 s; ID 1000 (low bits) handed out at t=500: at
    # t=1000 it has been held 500 s, read within one poll of that.
    for t in range(0, 1001, 10):
        clock.record(base + 2 * t, float(t))
    held = clock.age(1000)
    assert held is not None and 490.0 <= held <= 500.0, held
    clock.record(None, 1001.0)
    assert clock.age(1000) is None  # no primary this poll: nothing dated
    # A clock that goes back is another server's (a failover): its IDs are dated afresh.
    clock.record(base + 5, 1002.0)
    assert clock.age(1000) == 0.0
