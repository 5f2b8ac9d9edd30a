"""Why a replica is behind (diagnosis.py, replayload.py, views/recovery.py): pure logic.

The real causes, made for real on real servers, are in tests/integration/test_why_behind.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from lagwatch.config import load_config
from lagwatch.errors import ConfigError
from lagwatch.estimate.diagnosis import STAGES, Positions, Signals, diagnose, split
from lagwatch.estimate.replayload import ReplayLoadTracker
from lagwatch.views.recovery import Holder, Recovery, without_query_text
from lagwatch.views.recovery import parse as parse_recovery

MB = 1 << 20


def clock(rate: float, current: int):
    """An LSN clock of a primary writing ``rate`` bytes a second up to ``current`` (now)."""
    return lambda lsn: max(0.0, (current - lsn) / rate)


def startup(wait_type: str | None, wait: str | None, **kw) -> Recovery:
    return Recovery(4242, wait_type, wait, **kw)


def test_the_stages_add_up_to_the_staleness_and_each_is_where_the_bytes_are() -> None:
    # 1 MB/s: the primary at 10 MB; sent to 9 MB, written 8.5, flushed 8, replayed 6.
    p = Positions(current=10 * MB, sent=9 * MB, write=17 * MB // 2, flush=8 * MB, received=8 * MB, replay=6 * MB)
    seconds, nbytes = split(4.0, p, clock(MB, 10 * MB))
    assert seconds == pytest.approx((1.0, 0.5, 0.5, 2.0))
    assert nbytes == (MB, MB // 2, MB // 2, 2 * MB)


def test_the_stages_are_held_within_a_lower_headline() -> None:
    # WAL dating says 1.2 s (a big transaction's bytes are older than its commit): the byte
    # clock's 4 s is not the staleness; the parts still add up to what the headline says.
    p = Positions(current=10 * MB, sent=9 * MB, write=9 * MB, flush=8 * MB, replay=6 * MB)
    seconds, _ = split(1.2, p, clock(MB, 10 * MB))
    assert sum(seconds) == pytest.approx(1.2)
    assert seconds == pytest.approx((1.0, 0.0, 0.2, 0.0))


@given(st.lists(st.integers(0, 100 * MB), min_size=5, max_size=5), st.floats(0, 100),
       st.floats(1e3, 1e9), st.lists(st.booleans(), min_size=3, max_size=3))
def test_the_stages_never_go_negative_and_always_add_up(lsns: list[int], staleness: float, rate: float,
                                                        known: list[bool]) -> None:
    current, sent, write, flush, replay = sorted(lsns, reverse=True)
    p = Positions(current, sent if known[0] else None, write if known[1] else None, flush if known[2] else None,
                  None, replay)
    seconds, nbytes = split(staleness, p, clock(rate, current))
    assert all(s >= 0 for s in seconds)
    assert sum(seconds) == pytest.approx(staleness, abs=1e-9)
    assert all(b is None or b >= 0 for b in nbytes)


def test_the_cause_of_the_largest_part_wins_and_the_others_are_listed() -> None:
    p = Positions(current=10 * MB, sent=9 * MB, write=9 * MB, flush=9 * MB, replay=6 * MB)
    d = diagnose(4.0, p, clock(MB, 10 * MB), Signals(startup("IPC", "RecoveryPause"), "paused", streaming=True))
    assert d.cause == "replay_paused"
    assert d.causes == (("replay_paused", pytest.approx(3.0)), ("sender", pytest.approx(1.0)))
    assert "pg_wal_replay_resume()" in d.detail


@pytest.mark.parametrize(("recovery", "signals", "cause"), [
    (startup("Timeout", "RecoveryApplyDelay"), {"apply_delay": 0.04}, "apply_delay"),
    # Sampled between two waits of the delay: still the delay, as long as it explains the lag.
    (startup("Activity", "RecoveryWalStream"), {"apply_delay": 3.0}, "apply_delay"),
    (startup(None, None), {"apply_delay": 3.0}, "apply_delay"),  # working on what the delay let through
    (startup(None, None), {"apply_delay": 0.04}, "replay_busy"),  # 4 s behind: far more than the delay
    (startup("Activity", "RecoveryWalStream"), {"apply_delay": 0.04}, "network"),
    (None, {"apply_delay": 0.04}, "unknown"),  # not seen: a 40 ms delay does not explain 4 s
    (startup("IPC", "SomethingElse"), {}, "unknown"),  # a wait not known to be replay's work
    (startup("Lock", "relation"), {}, "recovery_conflict"),
    (startup("BufferPin", "BufferPin"), {}, "recovery_conflict"),
    (startup(None, None), {}, "replay_busy"),
    (startup("IO", "DataFileRead"), {}, "replay_busy"),
    (startup("IPC", "RecoveryPause"), {}, "replay_paused"),
    (None, {"pause_state": "pause requested"}, "replay_paused"),
    (None, {}, "unknown"),
])
def test_what_holds_replay(recovery: Recovery | None, signals: dict, cause: str) -> None:
    p = Positions(current=10 * MB, sent=10 * MB, write=10 * MB, flush=10 * MB, replay=6 * MB)
    d = diagnose(4.0, p, clock(MB, 10 * MB), Signals(recovery, streaming=True, **signals))
    assert d.cause == cause
    assert d.stage_seconds == pytest.approx((0, 0, 0, 4.0))


def test_a_lock_conflict_names_the_session_that_holds_it() -> None:
    holder = Holder(777, "alice", "idle in transaction", 12.5, True)
    rec = startup("Lock", "relation", holders=(holder,), max_streaming_delay=30.0)
    p = Positions(current=2 * MB, sent=2 * MB, write=2 * MB, flush=2 * MB, replay=MB)
    d = diagnose(1.0, p, clock(MB, 2 * MB), Signals(rec, streaming=True))
    assert (d.cause, d.conflict) == ("recovery_conflict", "lock")
    assert "pid 777 (alice, transaction open 12.5s)" in d.detail
    assert "max_standby_streaming_delay 30s" in d.detail


def test_sent_but_not_written_is_the_network_and_unsent_the_sender() -> None:
    p = Positions(current=10 * MB, sent=8 * MB, write=2 * MB, flush=2 * MB, replay=2 * MB)
    d = diagnose(8.0, p, clock(MB, 10 * MB), Signals(startup("Activity", "RecoveryWalStream"), streaming=True))
    assert d.cause == "network"
    assert dict(d.causes) == {"network": pytest.approx(6.0), "sender": pytest.approx(2.0)}


def test_no_wal_receiver_is_not_streaming_and_says_so() -> None:
    # No walsender: all the replica lacks beyond what it received is "not streaming".
    p = Positions(current=10 * MB, received=4 * MB, replay=4 * MB)
    rec = startup("Activity", "RecoveryWalStream", restore_command_set=False)
    d = diagnose(6.0, p, clock(MB, 10 * MB), Signals(rec, streaming=False, receiver_status=None))
    assert d.cause == "not_streaming"
    # Nothing says what was sent: all it has not received counts as not sent.
    assert d.stage_bytes == (6 * MB, 0, 0, 0)
    assert "primary_conninfo" in d.detail
    archive = diagnose(6.0, p, clock(MB, 10 * MB), Signals(startup("Activity", "RecoveryRetrieveRetryInterval",
                                                                   restore_command_set=True),
                                                           streaming=False, replay_advanced=True))
    assert "archive" in archive.detail


def test_caught_up_is_caught_up_whatever_the_bytes() -> None:
    p = Positions(current=10 * MB, sent=10 * MB, write=10 * MB, flush=10 * MB, replay=9 * MB)
    d = diagnose(0.0, p, clock(MB, 10 * MB), Signals(startup(None, None), streaming=True))
    assert d.cause == "caught_up"
    assert d.stage_seconds == (0.0, 0.0, 0.0, 0.0)
    assert d.stage_bytes[3] == MB


def test_replay_load_counts_working_samples_over_the_window() -> None:
    loads = ReplayLoadTracker(window=10.0)
    working, waiting = startup(None, None, startup_reads=0), startup("Activity", "RecoveryWalStream")
    for i in range(20):  # one sample a second: the first ten fall out of the window
        rec = working if i >= 15 else waiting
        if i >= 15:
            rec = startup(None, None, startup_reads=100 * (i - 15))
        load = loads.note("r1", float(i), rec)
    assert load is not None
    assert load.samples == 11
    assert load.busy_ratio == pytest.approx(5 / 11)
    assert load.read_rate == pytest.approx(100.0)  # from the samples that carry a count
    assert load.startup_reads == 400
    assert loads.note("r1", 19.0, working) == load  # the same answer again adds nothing
    assert loads.note("r2", 1.0, None) is None  # never seen


@pytest.mark.parametrize(("waits", "busy"), [
    # Delay, pause, conflict and waiting for WAL: not replay at its limit.
    ([("Timeout", "RecoveryApplyDelay"), ("IPC", "RecoveryPause"), ("Lock", "relation"),
      ("Activity", "RecoveryWalStream")], 0.0),
    # Restoring from the archive and unknown waits are not work; I/O and a buffer's lock are.
    ([("IPC", "RestoreCommand"), ("IPC", "SomethingElse"), ("IO", "DataFileRead"), ("LWLock", "BufferContent")], 0.5),
])
def test_which_waits_are_replays_own_work(waits: list[tuple[str, str]], busy: float) -> None:
    loads = ReplayLoadTracker(window=100.0)
    for i, (t, e) in enumerate(waits):
        load = loads.note("r1", float(i), startup(t, e))
    assert load is not None and load.busy_ratio == busy
    assert startup("IPC", "ReplicationSlotDrop").conflict == "active_logicalslot"


def test_recovery_view_parses_holders_and_conflicts() -> None:
    row = {"startup_pid": 10, "wait_event_type": "Lock", "wait_event": "relation",
           "holders": [{"pid": 11, "user": "bob", "state": "idle in transaction", "xact_age": 3.5}],
           "confl_snapshot": 1, "confl_lock": 2, "confl_bufferpin": 0, "confl_tablespace": 0, "confl_deadlock": 0,
           "startup_reads": None, "max_streaming_delay": -1, "restore_command_set": None}
    rec = parse_recovery([row])
    assert rec.conflict == "lock" and rec.activity == "conflict"
    assert rec.holders == (Holder(11, "bob", "idle in transaction", 3.5, True),)
    assert rec.conflicts == {"snapshot": 1, "lock": 2, "bufferpin": 0, "tablespace": 0, "deadlock": 0}
    assert parse_recovery([]).activity is None
    assert STAGES == ("send", "write", "flush", "replay")


def test_query_text_shows_only_where_read() -> None:
    from lagwatch.config import Config
    from lagwatch.estimate.snapshot import ReplicaState
    from lagwatch.estimate.windows import HistogramCounts
    from lagwatch.serve.status import why

    cluster = {"name": "main", "primary": {"dsn": "host=p"}, "replicas": [{"name": "r1", "dsn": "host=r"}]}
    assert Config.model_validate({"clusters": [cluster]}).conflict_query_text is False
    assert Config.model_validate({"clusters": [cluster], "conflict_query_text": True}).conflict_query_text is True

    def holders(*hs: Holder) -> list[dict]:
        r = ReplicaState(name="r1", configured=True, staleness=1.0, staleness_source="replica", window=None,
                         histogram=HistogramCounts((), (), 0.0, 0), replay_lsn=1, streaming=True, node_up=True,
                         recovery=startup("Lock", "relation", holders=hs))
        return why(r)["holders"]

    assert "query" not in holders(Holder(1, "a", "active", 1.0, True))[0]
    assert holders(Holder(1, "a", "active", 1.0, True, "SELECT 1"))[0]["query"] == "SELECT 1"


def test_a_replica_nothing_is_known_of_is_not_streaming_not_a_missing_grant() -> None:
    # Down: no answer of its own, no walsender; nothing says it has more than it replayed.
    p = Positions(current=10 * MB, replay=4 * MB)
    d = diagnose(6.0, p, clock(MB, 10 * MB), Signals(None, streaming=False, walsender=False, answered=False))
    assert d.cause == "not_streaming" and d.stage_seconds == pytest.approx((6.0, 0, 0, 0)), d
    # Its receiver hidden from the role (streaming unknown) and no walsender: not the sender.
    d = diagnose(6.0, p, clock(MB, 10 * MB), Signals(None, streaming=None, walsender=False))
    assert d.cause == "not_streaming", d


def test_a_few_milliseconds_behind_is_caught_up() -> None:
    p = Positions(current=10 * MB, sent=10 * MB - 5000, write=10 * MB - 5000, flush=10 * MB - 5000, replay=9 * MB)
    d = diagnose(0.008, p, clock(MB, 10 * MB), Signals(startup(None, None), streaming=True))
    assert d.cause == "caught_up"
    assert sum(d.stage_seconds) == pytest.approx(0.008)  # the stages still say where


def test_a_conflict_in_archive_recovery_names_the_archive_delay() -> None:
    rec = startup("Lock", "relation", holders=(Holder(7, "u", "idle", 1.0, True),), max_streaming_delay=30.0,
                  max_archive_delay=60.0)
    p = Positions(current=2 * MB, received=2 * MB, replay=MB)
    d = diagnose(1.0, p, clock(MB, 2 * MB), Signals(rec, streaming=False, walsender=False))
    assert "max_standby_archive_delay 1m" in d.detail or "max_standby_archive_delay 60s" in d.detail, d.detail


def test_conflict_counters_never_go_back() -> None:
    from lagwatch.estimate.replayload import ConflictTotals

    totals = ConflictTotals()
    assert totals.note("r1", {"lock": 3, "snapshot": 1}) == {"lock": 3, "snapshot": 1}
    assert totals.note("r1", {"lock": 5, "snapshot": 1}) == {"lock": 5, "snapshot": 1}
    # A database dropped (its counts gone from the sum), then one more conflict.
    assert totals.note("r1", {"lock": 1, "snapshot": 0}) == {"lock": 5, "snapshot": 1}
    assert totals.note("r1", {"lock": 2, "snapshot": 0}) == {"lock": 6, "snapshot": 1}
    assert totals.note("r1", None) == {"lock": 6, "snapshot": 1}  # not read this cycle: kept


def test_query_text_is_dropped_from_what_the_server_sent_unless_turned_on(tmp_path: Path) -> None:
    """With conflict_query_text off, a holder's query text the server sent anyway (a role
    told 'on') is dropped; on, it needs basic auth on the web endpoints, or the config is
    refused (other users' query text served to anyone who reaches the port)."""
    texted = Recovery(9, "Lock", "relation", holders=(
        Holder(1, "app", "active", 2.0, True, "SELECT 'password=Hunter2'"), Holder(2, "app", "idle", 1.0, False, None)))
    stripped = without_query_text(texted)
    assert [h.query for h in stripped.holders] == [None, None]
    assert [dataclasses.replace(h, query=None) for h in texted.holders] == list(stripped.holders)
    plain = Recovery(9, "Lock", "relation", holders=(Holder(2, "app", "idle", 1.0, False, None),))
    assert without_query_text(plain) is plain

    config = tmp_path / "lagwatch.yaml"
    body = {"listen": "127.0.0.1:9", "conflict_query_text": True,
            "clusters": [{"name": "main", "primary": {"dsn": "host=p"}}]}
    config.write_text(yaml.safe_dump(body))
    with pytest.raises(ConfigError, match="conflict_query_text: true serves other users' query text"):
        load_config(config)
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  prom: $2b$04$" + "a" * 53 + "\n")
    config.write_text(yaml.safe_dump({**body, "web_config_file": str(web)}))
    assert load_config(config).conflict_query_text is True
