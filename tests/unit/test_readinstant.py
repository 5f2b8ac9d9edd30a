"""When a replica's answer was true (readinstant.py): never later than the truth, as close
as the quickest recent answer allows, within [asked, observed]."""

import random

from lagwatch.estimate.clockoffset import WINDOW as OFFSET_WINDOW
from lagwatch.estimate.readinstant import ReadInstants

OFFSET = 1_700_000_000.0 - 5_000.0  # the replica's clock less ours


def test_never_later_than_the_true_read_and_close_after_one_quick_answer() -> None:
    rng = random.Random(7)
    instants = ReadInstants()
    errors = []
    asked = 5_000.0
    for i in range(200):
        asked += 0.1
        quick = i % 20 == 0  # now and then an answer read at once
        read = asked + (0.0002 if quick else rng.uniform(0.001, 0.08))  # the replica read its position then
        observed = read + rng.uniform(0.0001, 0.02)
        got = instants.instant("r1", asked, observed, read + OFFSET)
        assert asked <= got <= read + 1e-9, (i, got, read)  # never later than the truth
        errors.append(read - got)
    # Within the quickest answer's own delay (0.2 ms), where dating at ``asked`` erred by up to 80 ms.
    assert max(errors[1:]) < 0.0003, max(errors)


def test_without_a_clock_it_is_the_moment_asked_and_a_clock_stepped_forward_never_passes_the_answer() -> None:
    instants = ReadInstants()
    assert instants.instant("r1", 10.0, 10.05, None) == 10.0
    instants.instant("r1", 10.0, 10.001, 10.0005 + OFFSET)
    # The replica's clock jumps 1 s forward: held at the answer's arrival, not a second late.
    assert instants.instant("r1", 10.1, 10.13, 10.11 + OFFSET + 1.0) == 10.13
    # Gone from the window, the old offset no longer counts: a lone answer is dated when asked,
    # and a quick one after it sets the new offset.
    later = 10.1 + OFFSET_WINDOW + 1
    assert instants.instant("r1", later, later + 0.05, later + 0.02 + OFFSET + 1.0) == later
    instants.instant("r1", later + 0.1, later + 0.1002, later + 0.1001 + OFFSET + 1.0)
    assert abs(instants.instant("r1", later + 0.2, later + 0.26, later + 0.25 + OFFSET + 1.0) - (later + 0.2499)) < 1e-6
    instants.forget("r1")
    assert instants.instant("r1", 50.0, 50.05, 50.04 + OFFSET) == 50.0
