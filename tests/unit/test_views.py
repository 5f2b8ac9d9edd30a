"""Each view: the SQL chosen by server version, and parse() on canned rows."""

import pytest
from lagwatch.lsn import format_lsn, parse_lsn
from lagwatch.rooms import VIEWS as ROOM_VIEWS
from lagwatch.rooms import probe_columns, slots
from lagwatch.views import CYCLE_VIEWS, replication, server, wal_receiver, walinspect
from lagwatch.views.probe import Capabilities


def test_lsn_roundtrip() -> None:
    assert parse_lsn("16/B374D848") == 0x16B374D848
    assert format_lsn(0x16B374D848) == "16/B374D848"
    assert parse_lsn(None) is None
    with pytest.raises(ValueError):
        parse_lsn("garbage")


@pytest.mark.parametrize("version", [130000, 140000, 150000, 160000, 170000, 180000])
def test_every_view_has_sql_for_13_to_18_wherever_it_applies(version: int) -> None:
    """A view with no SQL for a version says it does not apply there (views/base.py), so a
    poll never asks for it; every other view has SQL for 13 to 18."""
    for in_recovery in (False, True):
        # Every room's probe column true: each view at its fullest (archive_mode always).
        asked = {column: True for column in probe_columns()} | {"archive_mode": "always"}
        caps = Capabilities(version, in_recovery, has_walinspect=True, can_walinspect=True,
                            can_read_all_stats=True, asked=asked)
        for view in (*CYCLE_VIEWS, *ROOM_VIEWS):
            assert bool(view.sql(caps)) or not view.readable(caps), (view.name, version)
    # Those with no SQL before some major (startup_io from 16, slot sync from 17) do not apply there.
    assert {v.name for v in (*CYCLE_VIEWS, *ROOM_VIEWS) if not v.sql_for(version)} <= {"startup_io", "slotsync"}


def test_versioned_sql_choices() -> None:
    assert "pg_is_wal_replay_paused" in (server.VIEW.sql_for(130000) or "")
    assert "pg_get_wal_replay_pause_state" in (server.VIEW.sql_for(140000) or "")
    assert "inactive_since" not in (slots.VIEW.sql_for(160000) or "")
    assert "inactive_since" in (slots.VIEW.sql_for(170000) or "")
    assert "NULL::text AS invalidation_reason" not in (slots.VIEW.sql_for(180000) or "")
    assert server.VIEW.sql_for(120000) is None


def test_server_on_replica_and_primary() -> None:
    replica = server.parse([{"in_recovery": True, "current_lsn": None, "receive_lsn": "0/3000100",
                             "replay_lsn": "0/3000000", "replay_pause_state": "paused",
                             "last_replay_age_seconds": 61.6, "last_replay_epoch": 1_700_000_000.25,
                             "clock_epoch": 1_700_000_061.85, "xacts_total": 12.0}])
    assert replica.replay_paused is True
    assert replica.last_replay_epoch == 1_700_000_000.25 and replica.clock_epoch == 1_700_000_061.85
    assert replica.receive_replay_bytes == 0x100
    primary = server.parse([{"in_recovery": False, "current_lsn": "0/5000000", "receive_lsn": None,
                             "replay_lsn": None, "replay_pause_state": None, "last_replay_age_seconds": None,
                             "last_replay_epoch": None, "clock_epoch": 1_700_000_000.0,
                             "xacts_total": 4242.0}])
    assert primary.current_lsn == 0x5000000 and primary.replay_paused is None and primary.xacts_total == 4242
    requested = server.parse([{"in_recovery": True, "current_lsn": None, "receive_lsn": None, "replay_lsn": None,
                               "replay_pause_state": "pause requested", "last_replay_age_seconds": None,
                               "last_replay_epoch": None, "clock_epoch": None, "xacts_total": None}])
    assert requested.replay_paused is True and requested.receive_replay_bytes is None


def _sender_row(**over: object) -> dict[str, object]:
    row: dict[str, object] = {
        "application_name": "replica1", "client_addr": "127.0.0.2", "state": "streaming", "sync_state": "async",
        "sent_lsn": "0/3000000", "write_lsn": "0/3000000", "flush_lsn": "0/3000000", "replay_lsn": "0/3000000",
        "current_lsn": "0/3000000", "write_lag": None, "flush_lag": None, "replay_lag": None,
        "slot_name": "replica1"}
    row.update(over)
    return row


def test_walsender_null_lag_while_caught_up_is_zero() -> None:
    (sender,) = replication.parse([_sender_row()])
    assert [sender.lag_seconds(s) for s in ("write", "flush", "replay")] == [0.0, 0.0, 0.0]
    assert [sender.lag_bytes(s) for s in replication.STAGES] == [0, 0, 0, 0]


def test_walsender_null_lag_while_behind_is_unknown_not_zero() -> None:
    (sender,) = replication.parse([_sender_row(current_lsn="0/3001000", sent_lsn="0/3001000",
                                               write_lsn="0/3001000", flush_lsn="0/3001000",
                                               replay_lsn="0/3000000", write_lag=0.001, flush_lag=0.002)])
    assert sender.lag_seconds("write") == 0.001
    assert sender.lag_seconds("replay") is None
    assert sender.lag_bytes("replay") == 0x1000 and sender.lag_bytes("sent") == 0


def test_walsender_duplicate_names_keep_the_first_by_pid_and_order_by_name() -> None:
    senders = replication.parse([_sender_row(pid=12, client_addr="b"), _sender_row(pid=11, client_addr="a"),
                                 _sender_row(pid=13, application_name="other"),
                                 _sender_row(pid=14, application_name="pg_basebackup")])
    assert [(s.application_name, s.client_addr) for s in senders] == [("other", "127.0.0.2"), ("replica1", "a")]


def test_sender_names_are_read_once_per_walsender_and_forgotten_when_it_goes() -> None:
    names = replication.SenderNames()
    cycle = [{"pid": 11, "state": "streaming"}, {"pid": 12, "state": "streaming"}]
    assert names.missing(cycle) == [11, 12]
    names.learn([{"pid": 11, "application_name": "replica1", "client_addr": "127.0.0.2"}])  # 12 already gone
    # 12 has no row, as in the view (which joins the sessions): it left before it was named.
    assert [(r["application_name"], r["client_addr"]) for r in names.named(cycle)] == [("replica1", "127.0.0.2")]
    assert names.missing(cycle) == [12]
    names.learn([{"pid": 12, "application_name": "replica2", "client_addr": None}])
    assert names.missing(cycle) == []
    # 11 reconnects as 21 (not named yet: no row); a later walsender given pid 11 is asked for again.
    assert [r["pid"] for r in names.named([{"pid": 12, "state": "streaming"}, {"pid": 21, "state": "catchup"}])] == [12]
    assert names.missing([{"pid": 11, "state": "streaming"}]) == [11]
    # A cycle that did not read them (the view failed, or rests): every name is asked for again.
    names.forget()
    assert names.missing([{"pid": 12, "state": "streaming"}]) == [12]
    names.learn([{"pid": 12, "application_name": "replica2", "client_addr": None}])
    # A row keeps every column of its own, with the names added.
    (row,) = names.named([{"pid": 12, "state": "streaming", "sent_lsn": "0/1"}])
    assert row == {"pid": 12, "state": "streaming", "sent_lsn": "0/1", "application_name": "replica2",
                   "client_addr": None}


def test_wal_receiver_absent_means_not_streaming() -> None:
    assert wal_receiver.parse([]).streaming is False
    assert wal_receiver.parse([{"status": "streaming"}]).streaming is True
    assert wal_receiver.parse([{"status": "waiting"}]).streaming is False


def test_slots_parse_all_versions() -> None:
    (slot,) = slots.parse([{"slot_name": "inactive", "slot_type": "physical", "database": None, "plugin": None,
                            "active": False, "temporary": False, "wal_status": "extended",
                            "safe_wal_size": 1000.0, "retained_bytes": 5000.0, "confirmed_flush_lag_bytes": None,
                            "conflicting": None, "inactive_seconds": 12.5, "invalidation_reason": None}])
    assert slot.retained_bytes == 5000 and slot.safe_wal_size == 1000 and slot.inactive_seconds == 12.5
    assert slot.active is False and slot.confirmed_flush_lag_bytes is None


def test_walinspect() -> None:
    inspection = walinspect.parse([{"start_lsn": "0/1000000", "end_lsn": "0/1800000", "flush_lsn": "0/2000000",
                                    "records": 10.0, "record_bytes": 100.0, "fpi_bytes": 8000.0}])
    assert inspection.inspected_bytes == 0x800000 and inspection.skipped_bytes == 0x800000
