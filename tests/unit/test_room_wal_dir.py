"""The pg_wal room (rooms/wal_dir.py), pure: where it applies, what it keeps, exports and
shows, and the primary's directory a slot's share is judged against."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from lagwatch.config.options import ClusterOptions
from lagwatch.estimate.snapshot import ClusterSnapshot, Snapshot
from lagwatch.render.text import render_text
from lagwatch.rooms import missing_grants, wal_dir
from lagwatch.rooms.base import Cycle
from lagwatch.rooms.slots import Slot
from lagwatch.rooms.wal_dir import WalDir, WalDirs
from lagwatch.serve.export import families
from lagwatch.serve.status import cluster_status
from lagwatch.serve.status_page import render
from lagwatch.views.probe import Capabilities

MiB = 1 << 20


@pytest.mark.parametrize(("asked", "applies"), [
    ({"wal_dir": True}, True),
    ({"wal_dir": False}, False),  # pg_ls_waldir() would fail outright: not in the statement
    ({}, False),  # never asked: never guessed
])
def test_it_is_read_where_the_probe_found_the_grant(asked: dict[str, Any], applies: bool) -> None:
    caps = Capabilities(180000, False, False, False, True, asked=asked)
    assert wal_dir.VIEW.readable(caps) is applies
    assert wal_dir.VIEW.roles == {"primary"}
    # A primary without it is told (once at connect, and by check --grants); a replica is not:
    # it never reads pg_wal.
    assert [room.name for room, _ in missing_grants(caps)].count("wal_dir") == (asked == {"wal_dir": False})
    standby = Capabilities(180000, True, False, False, True, asked=asked)
    assert "wal_dir" not in [room.name for room, _ in missing_grants(standby)]


def test_parse_and_keep_each_primary_that_answered() -> None:
    assert wal_dir.parse([{"bytes": 33554432.0, "files": 2}]) == WalDir(32 * MiB, 2)
    keeper = wal_dir.ROOM.keeper()  # the room's own keeper
    main = ClusterOptions(name="main")
    assert keeper.update({}, Cycle(1.0, main, "a")) is None  # no primary answered with it: nothing to say
    # Two primaries (split brain): each one's directory, by node; the slots' share is of the
    # leading one's (the cycle's primary), never of the other server's.
    dirs = keeper.update({"b": WalDir(48 * MiB, 3), "a": WalDir(16 * MiB, 1)}, Cycle(2.0, main, "b", (UNLIMITED,)))
    assert dirs is not None and dirs.by_node == {"a": WalDir(16 * MiB, 1), "b": WalDir(48 * MiB, 3)}
    assert list(dirs.by_node) == ["a", "b"] and dirs.slot_shares == {"cdc": 16 / 48}
    limited = replace(UNLIMITED, name="capped", safe_wal_size=MiB)  # max_slot_wal_keep_size says its room
    for cycle in (Cycle(3.0, main, None, (UNLIMITED,)), Cycle(3.0, main, "a", (limited,))):
        assert (keeper.update({"a": WalDir(16 * MiB, 1)}, cycle) or WalDirs({}, {"x": 1.0})).slot_shares == {}
    # A slot retaining more than the directory holds (read a poll apart) is all of it.
    assert (keeper.update({"a": WalDir(8 * MiB, 1)}, Cycle(4.0, main, "a", (UNLIMITED,)))
            or WalDirs({}, {})).slot_shares == {"cdc": 1.0}


# retained 16 MiB, no safe_wal_size (no max_slot_wal_keep_size limit)
UNLIMITED = Slot("cdc", "logical", None, None, False, False, "reserved", None, 16 * MiB, None, None, None, None)


def snapshot_with(dirs: dict[str, WalDir] | None, slots: tuple[Slot, ...] = ()) -> Snapshot:
    value = None if dirs is None else wal_dir.ROOM.keeper().update(
        dirs, Cycle(1.0, ClusterOptions(name="main"), "primary", slots))
    cluster = ClusterSnapshot(name="main", primary_lsn=None, wal_rate_bytes_per_second=None, replicas=(),
                              walinspect=None, nodes=(), primary_node="primary",
                              rooms={} if value is None else {"wal_dir": value})
    return Snapshot(1.0, 0.01, 1, 0, (cluster,), interval=1.0, effective_interval=1.0)


def test_exported_per_node_shown_and_a_slots_share_is_of_the_primarys() -> None:
    unlimited = UNLIMITED
    dirs = {"primary": WalDir(64 * MiB, 4), "old": WalDir(512 * MiB, 32)}
    text = render_text(families(snapshot_with(dirs, (unlimited,)))).decode()
    for line in (f'lagwatch_wal_directory_bytes{{cluster="main",node="primary"}} {64 * MiB}',
                 'lagwatch_wal_directory_files{cluster="main",node="primary"} 4',
                 f'lagwatch_wal_directory_bytes{{cluster="main",node="old"}} {512 * MiB}',
                 # 16 MiB of the primary's 64, never of the other server's 512
                 'lagwatch_slot_wal_dir_share{cluster="main",slot="cdc"} 0.25'):
        assert line in text, line
    assert cluster_status(snapshot_with(dirs).clusters[0])["wal_dir"] == [
        {"node": "old", "bytes": 512 * MiB, "files": 32}, {"node": "primary", "bytes": 64 * MiB, "files": 4}]
    assert "pg_wal: primary 64 MiB in 4 files" in render(snapshot_with({"primary": WalDir(64 * MiB, 4)}))
    # Not read (no grant, or the primary did not answer): no series, no share, null.
    text = render_text(families(snapshot_with(None, (unlimited,)))).decode()
    assert "lagwatch_wal_directory_bytes{" not in text and "lagwatch_slot_wal_dir_share{" not in text
    assert cluster_status(snapshot_with(None).clusters[0])["wal_dir"] is None
