"""How long cycles take and whether they fit (estimate/cyclestats.py): the first cycle kept
apart, the window's quantiles, overruns, the pace kept while they do not fit and the one
WARNING a minute that says so."""

from __future__ import annotations

import logging

import pytest
from lagwatch.estimate.cyclestats import CYCLE_QUANTILES, CycleStats, watchdog_budget
from lagwatch.estimate.lateness import MAX_STRETCH


def test_the_first_cycle_apart_then_the_window_and_overruns() -> None:
    stats = CycleStats(1.0)
    stats.finished(0.9, 0.0)  # the first connects everywhere: kept apart
    assert stats.first_cycle == 0.9 and stats.quantiles() == ()
    for d in (0.1, 0.2, 0.3, 0.4):
        stats.finished(d, 0.0)
    assert stats.cycles == 5 and stats.overruns == 0
    assert dict(stats.quantiles()) == {0.5: 0.2, 0.9: 0.4, 0.99: 0.4, 1.0: 0.4}
    assert [q for q, _ in stats.quantiles()] == list(CYCLE_QUANTILES)
    assert stats.histogram().count == 4  # the first is not in it
    stats.skipped()  # a tick that came while a cycle ran
    assert stats.overruns == 1


def test_cycles_that_do_not_fit_stretch_the_pace_and_say_so_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    stats = CycleStats(1.0)
    caplog.set_level(logging.INFO, logger="lagwatch.daemon")
    stats.finished(0.5, 0.0)
    changes = [stats.finished(1.6, 0.0) for _ in range(5)]
    # The first is an overrun of the 1 s interval; the pace then kept fits the 1.6 s cycles.
    assert stats.overruns == 1
    assert stats.pace.overloaded and 1.6 <= stats.pace.interval <= MAX_STRETCH * 1.0
    assert any(c is not None for c in changes)  # the daemon is told the new pace when it changes
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cycles do not fit the 1s interval" in warnings[0].getMessage()
    stats.new_interval(2.0)  # a reload: kept as configured until cycles say otherwise
    assert stats.pace.interval == 2.0 and not stats.pace.overloaded


def test_the_watchdog_waits_for_the_slowest_pace_and_a_query() -> None:
    assert watchdog_budget(1.0, 0.8) == (MAX_STRETCH + 1) * 1.0 + 0.8
