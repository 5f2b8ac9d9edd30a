"""synchronous_standby_names as PostgreSQL parses it, and what a set of walsenders means
for commits. The grammar table follows the documentation of synchronous_standby_names
(runtime-config-replication) and PostgreSQL's syncrep_gram.y / syncrep_scanner.l; the
integration tests run the same settings on real servers."""

from __future__ import annotations

import pytest
from lagwatch.estimate.syncrep import StandbyNames, StandbyNamesError, assess, parse_standby_names
from lagwatch.views.replication import WalSender


@pytest.mark.parametrize(("text", "expected"), [
    ("", None),
    ("   ", None),
    ("s1", StandbyNames("priority", 1, ("s1",))),  # the legacy list: FIRST 1
    ("s1, s2, s3", StandbyNames("priority", 1, ("s1", "s2", "s3"))),
    ("*", StandbyNames("priority", 1, ("*",))),
    ("FIRST 2 (s1, s2, s3)", StandbyNames("priority", 2, ("s1", "s2", "s3"))),
    ("first 2 (s1,s2)", StandbyNames("priority", 2, ("s1", "s2"))),  # keywords in any case
    ("2 (s1, s2, s3)", StandbyNames("priority", 2, ("s1", "s2", "s3"))),  # FIRST is the default method
    ("ANY 1 (replica1, replica2)", StandbyNames("quorum", 1, ("replica1", "replica2"))),
    ("Any 2(*)", StandbyNames("quorum", 2, ("*",))),
    ('ANY 1 ("my standby", "Quoted""Name", s_2$x)', StandbyNames("quorum", 1, ("my standby", 'Quoted"Name', "s_2$x"))),
    ('"ANY", "first"', StandbyNames("priority", 1, ("ANY", "first"))),  # quoted keywords are names
    ("1, 2", StandbyNames("priority", 1, ("1", "2"))),  # numbers are names in a list
    ("FIRST 1 (1)", StandbyNames("priority", 1, ("1",))),
    ("anyone, firstly", StandbyNames("priority", 1, ("anyone", "firstly"))),  # not keywords
    ("\tFIRST 1 (\t s1 )  ", StandbyNames("priority", 1, ("s1",))),
])
def test_parsed_as_postgresql_does(text: str, expected: StandbyNames | None) -> None:
    assert parse_standby_names(text) == expected


@pytest.mark.parametrize("text", [
    "ANY (s1)", "FIRST s1", "ANY 0 (s1)", "2 s1", "FIRST 1 (s1", "FIRST 1 ()", "s1,", ",s1", "s1 s2",
    "any", "s1, first", 's1, "unterminated', "s1; s2", "ANY 1 (s1) s2",
])
def test_what_postgresql_refuses_is_refused(text: str) -> None:
    with pytest.raises(StandbyNamesError):
        parse_standby_names(text)


def test_names_match_case_insensitively_and_star_matches_any() -> None:
    names = parse_standby_names('FIRST 1 ("Replica1", *)')
    assert names is not None
    assert names.priority("replica1") == 1 and names.priority("other") == 2
    assert parse_standby_names("a, b") is not None and parse_standby_names("a, b").priority("c") is None  # type: ignore[union-attr]


def sender(name: str, state: str = "streaming", sync_state: str = "async", lag: float | None = 0.001) -> WalSender:
    return WalSender(name, "127.0.0.1", state, sync_state, None, 100, 100, 100, 100, 100, lag, lag, lag)


def test_a_quorum_with_one_standby_left_still_commits_and_with_none_stalls() -> None:
    both = assess("ANY 1 (replica1, replica2)", "on", [sender("replica1", sync_state="quorum"),
                                                        sender("replica2", sync_state="quorum")])
    assert (both.required, both.healthy, both.at_risk, both.spare) == (1, 2, False, 1)
    one = assess("ANY 1 (replica1, replica2)", "on", [sender("replica1", sync_state="quorum")])
    assert (one.healthy, one.at_risk, one.spare) == (1, False, 0)  # one more loss stalls commits
    none = assess("ANY 1 (replica1, replica2)", "on", [sender("replica1", state="catchup")])
    assert (none.healthy, none.at_risk, none.commit_wait_seconds) == (0, True, None)


def test_first_two_with_one_standby_down_stalls() -> None:
    sync = assess("FIRST 2 (replica1, replica2)", "remote_apply", [sender("replica1", sync_state="sync")])
    assert (sync.method, sync.required, sync.healthy, sync.at_risk) == ("priority", 2, 1, True)


@pytest.mark.parametrize(("level", "waits"), [("off", False), ("local", False), ("remote_write", True),
                                               ("on", True), ("true", True), ("remote_apply", True)])
def test_only_levels_that_wait_on_standbys_are_at_risk(level: str, waits: bool) -> None:
    assert assess("s1", level, []).at_risk is waits


def test_commit_wait_is_the_lag_of_the_stage_the_level_waits_for() -> None:
    slow = WalSender("s1", None, "streaming", "sync", None, 100, 100, 100, 100, 90, 0.001, 0.002, 0.050)
    fast = WalSender("s2", None, "streaming", "potential", None, 100, 100, 100, 100, 100, 0.0005, 0.001, 0.003)
    assert assess("s1, s2", "remote_apply", [slow, fast]).commit_wait_seconds == 0.050  # FIRST 1: s1 decides
    assert assess("s1, s2", "on", [slow, fast]).commit_wait_seconds == 0.002
    assert assess("s1, s2", "remote_write", [slow, fast]).commit_wait_seconds == 0.001
    assert assess("ANY 1 (s1, s2)", "remote_apply", [slow, fast]).commit_wait_seconds == 0.003  # the fastest
    assert assess("ANY 2 (s1, s2)", "remote_apply", [slow, fast]).commit_wait_seconds == 0.050
    assert assess("FIRST 2 (s1, s2)", "remote_apply", [slow, fast]).commit_wait_seconds == 0.050
    assert assess("s1, s2", "local", [slow, fast]).commit_wait_seconds is None


def test_an_unparsable_setting_is_reported_not_raised() -> None:
    result = assess("ANY 1 (s1", "on", [])
    assert result.error and not result.at_risk and result.method is None


def test_a_standbys_apply_delay_is_in_the_remote_apply_wait() -> None:
    """PostgreSQL's replay_lag interpolates and shows ~0.1 ms under a 50 ms apply delay; a
    commit record is never replayed before the delay has passed since it arrived."""
    delayed = WalSender("s1", None, "streaming", "sync", None, 100, 100, 100, 100, 90, 0.0002, 0.0003, 0.0001)
    assert assess("s1", "remote_apply", [delayed], {"s1": 0.05}).commit_wait_seconds == pytest.approx(0.0502)
    assert assess("s1", "on", [delayed], {"s1": 0.05}).commit_wait_seconds == 0.0003  # flush: no delay
    slow = WalSender("s1", None, "streaming", "sync", None, 100, 100, 100, 100, 90, 0.0002, 0.0003, 0.2)
    assert assess("s1", "remote_apply", [slow], {"s1": 0.05}).commit_wait_seconds == 0.2  # PostgreSQL's when longer
