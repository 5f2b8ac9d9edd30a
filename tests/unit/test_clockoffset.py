"""The windowed bound on two clocks' offset (clockoffset.py) against the brute force it
replaces: the most (or least) of the answers whose moment lies in the window."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from lagwatch.estimate.clockoffset import ClockOffset

answers = st.lists(st.tuples(st.floats(0.0, 4.0), st.floats(-5.0, 5.0)), max_size=60)


@given(answers, st.sampled_from(["at_least", "at_most"]))
def test_the_bound_is_the_extreme_of_the_answers_in_the_window(steps: list[tuple[float, float]], side: str) -> None:
    bound = ClockOffset(side, window=10.0)  # type: ignore[arg-type]
    seen: list[tuple[float, float]] = []
    at = 0.0
    for gap, offset in steps:
        at += gap
        seen.append((at, offset))
        window = [o for t, o in seen if t >= at - 10.0]
        expected = max(window) if side == "at_least" else min(window)
        assert bound.note(at, offset) == expected
        assert bound.bound == expected


def test_a_quick_answer_holds_until_it_leaves_the_window() -> None:
    bound = ClockOffset("at_most", window=10.0)
    assert bound.bound is None
    assert bound.note(0.0, -950.004) == -950.004
    assert bound.note(5.0, -950.030) == -950.030  # quicker: taken
    assert bound.note(9.0, -950.010) == -950.030
    assert bound.note(15.5, -950.020) == -950.020  # 5.0's left the window
