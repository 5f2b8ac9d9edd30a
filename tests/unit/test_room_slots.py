"""The slots' room (rooms/slots.py): the leading primary's slots with the tracker's runways,
their families, /api/status part and /status line. Pure. Parsing by version:
test_views.py; on real servers: test_lag_truth.py, test_forecasts.py, test_logical.py."""

from __future__ import annotations

import math

from lagwatch.config.options import ClusterOptions
from lagwatch.estimate.snapshot import ClusterSnapshot, Snapshot
from lagwatch.render.text import render_text
from lagwatch.rooms import slots
from lagwatch.rooms.base import Cycle
from lagwatch.rooms.slots import Slot, Slots
from lagwatch.serve.export import families
from lagwatch.serve.status import cluster_status
from lagwatch.serve.status_page import render

MAIN = ClusterOptions(name="main")
CDC = Slot("cdc<x>", "logical", "app", "pgoutput", False, False, "extended", 4096, 10_000, 2_000, False, 30.0, None,
           idle_timeout_left=90.0)
R1 = Slot("replica1", "physical", None, None, True, False, "reserved", None, 512, None, None, None, None)


def test_the_leading_primarys_slots_with_the_cycles_runways() -> None:
    keeper = slots.ROOM.keeper()
    # The cycle's slots are the leading primary's (the tracker's reading of this room's view).
    value = keeper.update({"p1": (CDC, R1), "p0": (R1,)},
                          Cycle(1.0, MAIN, "p1", (CDC, R1), slot_runways={"cdc<x>": 60.0}))
    assert value == Slots((CDC, R1), {"cdc<x>": 60.0})
    assert keeper.update({"p0": (R1,)}, Cycle(2.0, MAIN, None)) == Slots((), {})  # never another node's


def snapshot_with(value: Slots | None) -> Snapshot:
    cluster = ClusterSnapshot("main", 1, None, (), None, (),
                              rooms={} if value is None else {"slots": value})
    return Snapshot(1.0e9, 0.004, 5, 0, (cluster,))


def test_exported_shown_and_its_runway_said() -> None:
    value = Slots((CDC, R1), {"cdc<x>": 1800.0, "replica1": math.inf})
    text = render_text(families(snapshot_with(value))).decode()
    for line in ('lagwatch_slot_retained_bytes{cluster="main",slot="cdc<x>"} 10000.0',
                 'lagwatch_slot_active{cluster="main",slot="replica1"} 1.0',
                 'lagwatch_slot_safe_wal_size_bytes{cluster="main",slot="cdc<x>"} 4096.0',
                 'lagwatch_slot_wal_status{cluster="main",slot="cdc<x>",status="extended"} 1.0',
                 'lagwatch_slot_wal_status{cluster="main",slot="cdc<x>",status="lost"} 0.0',
                 'lagwatch_slot_inactive_seconds{cluster="main",slot="cdc<x>"} 30.0',
                 'lagwatch_slot_confirmed_flush_lag_bytes{cluster="main",slot="cdc<x>"} 2000.0',
                 'lagwatch_slot_idle_timeout_left_seconds{cluster="main",slot="cdc<x>"} 90.0',
                 'lagwatch_slot_runway_seconds{cluster="main",slot="cdc<x>"} 1800.0',
                 'lagwatch_slot_runway_seconds{cluster="main",slot="replica1"} +Inf',
                 'lagwatch_slot_info{cluster="main",slot="replica1",slot_type="physical",database="",plugin="",'
                 'temporary="false",conflicting="",invalidation_reason=""} 1.0'):
        assert line in text, line
    assert 'lagwatch_slot_safe_wal_size_bytes{cluster="main",slot="replica1"}' not in text  # unlimited
    cdc, r1 = cluster_status(snapshot_with(value).clusters[0])["slots"]
    assert (cdc["name"], cdc["runway_seconds"], cdc["shrinking"]) == ("cdc<x>", 1800.0, True)
    assert (r1["runway_seconds"], r1["shrinking"]) == (None, False)  # JSON has no infinity
    assert cluster_status(snapshot_with(None).clusters[0])["slots"] == []
    page = render(snapshot_with(value))
    assert 'slot runway (until safe_wal_size is 0): <span class="bad">cdc&lt;x&gt;: 30m</span></div>' in page, page
    assert "slot runway" not in render(snapshot_with(Slots((R1,), {"replica1": math.inf})))


def test_through_the_tracker_the_leaders_slots_and_runways_or_none() -> None:
    """The tracker hands the room the leading primary's slots and its forecast of their
    runways; a cycle the primary does not answer has neither (never a stale one)."""
    from dataclasses import replace as changed

    from lagwatch.config import parse_config
    from lagwatch.estimate.snapshot import NodeObservation, ServerPosition
    from lagwatch.estimate.tracker import ClusterTracker

    config = parse_config({"clusters": [{"name": "main", "primary": {"dsn": "host=p"}}]}).clusters[0]
    tracker = ClusterTracker(config, 1.0, 60.0, horizon=10.0)
    limited = changed(CDC, safe_wal_size=60 << 20)

    def primary(t: int) -> NodeObservation:
        return NodeObservation("main", "primary", "primary", float(t), 0.001, asked_at=float(t),
                               position=ServerPosition(False, t << 20, None, None, None, None),
                               rooms={"slots": (changed(limited, safe_wal_size=(60 - t) << 20),)})

    for t in range(4):
        value = tracker.update([primary(t)], float(t)).rooms["slots"]
    assert [s.name for s in value.slots] == ["cdc<x>"] and value.runways["cdc<x>"] > 0
    down = NodeObservation("main", "primary", "primary", 4.0, 0.001, error_kind="connect", error="refused")
    assert tracker.update([down], 4.0).rooms["slots"] == Slots((), {})
