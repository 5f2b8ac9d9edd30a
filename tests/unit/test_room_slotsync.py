"""The failover slots' copies on the standbys (rooms/slotsync.py, PostgreSQL 17+): parse,
each standby judged against the primary's failover slots this cycle, families, /api/status,
/status. Pure. On real servers: tests/integration/test_logical.py (a standby syncing, then
not)."""

from __future__ import annotations

from lagwatch.config.options import ClusterOptions
from lagwatch.estimate.snapshot import ClusterSnapshot, Snapshot
from lagwatch.render.text import render_text
from lagwatch.rooms import slotsync
from lagwatch.rooms.base import Cycle
from lagwatch.rooms.slots import Slot
from lagwatch.serve.export import families
from lagwatch.serve.status import cluster_status
from lagwatch.serve.status_page import render
from lagwatch.views.probe import Capabilities

FAILOVER = Slot("fo", "logical", "postgres", "pgoutput", True, False, "reserved", None, 1, None, None, None, None,
                failover=True)
OTHER = Slot("plain", "logical", "postgres", "pgoutput", True, False, "reserved", None, 1, None, None, None, None,
             failover=False)


def test_read_on_17_standbys_only_with_the_setting_looked_at_first() -> None:
    assert not slotsync.VIEW.applies(Capabilities(160000, True, False, False, True))
    assert slotsync.VIEW.applies(Capabilities(170000, True, False, False, True))
    assert slotsync.VIEW.roles == frozenset({"replica"}) and slotsync.VIEW.every == 10
    assert slotsync.parse([{"enabled": None, "worker": None, "synced": []}]) is None
    assert "slotsync worker" in (slotsync.VIEW.sql_for(170000) or "")
    syncing = slotsync.parse([{"enabled": True, "worker": True, "synced": ["fo"]}])
    stopped = slotsync.parse([{"enabled": False, "worker": None, "synced": ["fo"]}])
    assert syncing is not None and syncing.syncing and stopped is not None and not stopped.syncing


def copies() -> slotsync.FailoverCopies | None:
    syncing = slotsync.SlotSync(True, True, frozenset({"fo"}))
    stopped = slotsync.SlotSync(False, False, frozenset({"fo"}))  # its copy is there but no longer kept in sync
    return slotsync.ROOM.keeper().update({"r2": stopped, "r1": syncing, "r3": None},
                                         Cycle(1.0, ClusterOptions(name="main"), "p", (FAILOVER, OTHER)))


def snapshot_with(value: slotsync.FailoverCopies | None) -> Snapshot:
    cluster = ClusterSnapshot("main", 1, None, (), None, (),
                              rooms={} if value is None else {"slotsync": value})
    return Snapshot(1.0e9, 0.004, 5, 0, (cluster,))


def test_each_standby_judged_against_the_primarys_failover_slots_this_cycle() -> None:
    value = copies()
    assert value is not None and list(value.by_standby) == ["r1", "r2"] and value.failover == ("fo",)
    no_standby = slotsync.ROOM.keeper().update({"r3": None}, Cycle(1.0, ClusterOptions(name="main"), "p"))
    assert no_standby is None  # before 17, or no standby answered: nothing to say
    text = render_text(families(snapshot_with(value))).decode()
    assert 'lagwatch_slot_synced{cluster="main",replica="r1",slot="fo"} 1.0' in text
    # Its copy is there but no longer kept in sync: a promotion would find it stale.
    assert 'lagwatch_slot_synced{cluster="main",replica="r2",slot="fo"} 0.0' in text
    synced = text.split("lagwatch_slot_synced", 1)[1].split("# HELP", 1)[0]
    assert 'replica="r3"' not in synced and 'slot="plain"' not in synced
    assert 'lagwatch_replica_slot_sync_running{cluster="main",replica="r2"} 0.0' in text
    assert cluster_status(snapshot_with(value).clusters[0])["slotsync"] == [
        {"node": "r1", "enabled": True, "worker": True, "synced": ["fo"], "missing": []},
        {"node": "r2", "enabled": False, "worker": False, "synced": ["fo"], "missing": ["fo"]}]
    assert cluster_status(snapshot_with(None).clusters[0])["slotsync"] is None
    page = render(snapshot_with(value))
    assert 'failover slots on the standbys: r1: all synced; <span class="bad">r2: not syncing</span>' in page


def test_the_leader_is_not_judged_and_a_former_primary_following_is() -> None:
    """Every node in recovery but the one that leads (a standby cluster's leader reads the
    view too): a former primary now following may be promoted again."""
    syncing = slotsync.SlotSync(True, True, frozenset({"fo"}))
    value = slotsync.ROOM.keeper().update({"standby_leader": syncing, "primary": syncing, "r1": syncing},
                                          Cycle(1.0, ClusterOptions(name="main"), "standby_leader", (FAILOVER,)))
    assert value is not None and list(value.by_standby) == ["primary", "r1"]
    assert value.missing("primary") == [] and value.missing("r1") == []
