"""What every room (lagwatch.rooms) promises: it is read, kept, exported, shown and granted
through the pipeline's one registry, and nothing of it lives outside its module."""

from __future__ import annotations

from pathlib import Path

import lagwatch.serve.export  # noqa: F401  (the catalogue with the rooms' families)
from lagwatch.render import families
from lagwatch.rooms import ROOMS, VIEWS, probe_columns
from lagwatch.views import CYCLE_VIEWS
from lagwatch.views.probe import SQL, parse, sql

ROOT = Path(__file__).resolve().parents[2]


def test_each_room_is_named_once_and_its_families_are_in_the_catalogue_under_its_section() -> None:
    names = [room.name for room in ROOMS]
    assert len(set(names)) == len(names) and not set(names) & {v.name for v in CYCLE_VIEWS}
    assert VIEWS == tuple(room.view for room in ROOMS)
    for room in ROOMS:
        assert room.families, room.name
        for spec in room.families:
            assert families.CATALOGUE[spec.name] is spec
        assert len({spec.section for spec in room.families}) == 1, room.name  # one section: the room's


def test_the_role_sql_gives_every_grant_a_room_needs() -> None:
    role_sql = (ROOT / "deploy" / "sql" / "lagwatch-role.sql").read_text()
    for room in ROOMS:
        for grant in room.grants:
            assert grant.statement.replace("ROLE", "lagwatch") + ";" in role_sql, (room.name, grant.name)


def test_the_probe_asks_what_the_rooms_ask_and_keeps_their_answers_apart() -> None:
    asked = probe_columns()
    text = sql(asked)
    assert text.startswith(SQL) and all(f"AS {column}" in text for column in asked)
    row = {"version_num": 180000, "in_recovery": False, "has_walinspect": False,
           "can_walinspect": False, "can_read_all_stats": True, "startup_pid": None, "room_column": "x"}
    assert parse([row]).asked == {"room_column": "x"}


def test_what_a_view_needs_is_a_grant_its_room_asks_for() -> None:
    """A name in View.needs the probe never asks would leave the view never read: each is
    one of its room's grants, asked once per connection."""
    asked = probe_columns()
    for room in ROOMS:
        assert set(room.view.needs) <= {grant.name for grant in room.grants} <= set(asked), room.name


def test_check_grants_says_a_rooms_missing_grant_and_what_is_not_read_without_it() -> None:
    """``check --grants`` (grants.py) learns the rooms' grants from them: a missing one is
    MISSING (the role SQL gives it and an alert or panel reads it), with what it costs."""
    from lagwatch.grants import missing_grants
    from lagwatch.views.probe import Capabilities

    asked = {column: True for column in probe_columns()} | {"archive_mode": "on"}
    full = Capabilities(170000, False, False, False, True, asked=asked)
    assert missing_grants(full, "watcher")[0] == {}
    without = Capabilities(170000, False, False, False, True,
                           asked=asked | {"archive_status": False, "wal_dir": False})
    missing, optional, _ = missing_grants(without, "watcher")
    assert missing == {
        "archiver": "GRANT EXECUTE ON FUNCTION pg_ls_archive_statusdir() TO watcher (without it, not read: the "
                    "segments waiting to be archived (pg_wal/archive_status))",
        "wal_dir": "GRANT EXECUTE ON FUNCTION pg_ls_waldir() TO watcher (without it, not read: the size of pg_wal)"}
    assert optional == {}
    # A replica is never told of what only a primary reads (pg_wal's size; archive_mode on).
    assert missing_grants(Capabilities(170000, True, False, False, True, asked=without.asked), "watcher")[0] == {}
