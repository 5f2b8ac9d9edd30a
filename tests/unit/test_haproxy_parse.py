"""parse_servers_state on real `show servers state` answers captured from HAProxy 2.6.12 (Debian 12)."""

from __future__ import annotations

from pathlib import Path

import pytest
from lagwatch.config import HAProxyPoolerConfig
from lagwatch.poolers.haproxy import HAProxyPooler, ServerState, parse_servers_state

_HEADER = (
    "# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight"
    " srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state"
    " srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port"
    " srv_check_addr srv_agent_addr srv_agent_port"
)

# replica2 "state drain", replica3 "state maint", down1 failing health checks, cfgdis configured
# "disabled", cfgdis_ready configured "disabled" then "state ready", track_drain / track_maint
# tracking replica2 / replica3.
CAPTURED = (
    "1\n"
    + _HEADER + "\n"
    "2 pg_read 1 replica1 127.0.0.1 2 0 1 1 2 6 3 4 6 0 0 0 - 25433 - 0 0 - - 0\n"
    "2 pg_read 2 replica2 127.0.0.1 2 8 1 1 2 6 3 4 6 0 0 0 - 25434 - 0 0 - - 0\n"
    "2 pg_read 3 replica3 127.0.0.1 0 1 1 1 2 6 3 0 14 0 0 0 - 25436 - 0 0 - - 0\n"
    "2 pg_read 4 down1 127.0.0.1 0 0 1 1 4 8 2 0 6 0 0 0 - 25435 - 0 0 - - 0\n"
    "2 pg_read 5 cfgdis 127.0.0.1 0 5 1 1 4 1 0 0 14 0 0 0 - 25436 - 0 0 - - 0\n"
    "2 pg_read 6 cfgdis_ready 127.0.0.1 2 4 1 1 1 6 3 4 6 0 0 0 - 25436 - 0 0 - - 0\n"
    "2 pg_read 7 track_drain 127.0.0.1 2 16 1 1 2 1 0 2 0 0 0 0 - 25436 - 0 0 - - 0\n"
    "2 pg_read 8 track_maint 127.0.0.1 0 2 1 1 2 1 0 0 0 0 0 0 - 25436 - 0 0 - - 0\n"
    "\n"
)


def test_captured_states() -> None:
    states = parse_servers_state(CAPTURED)
    assert states["replica1"] == ServerState(name="replica1", op_state=2, admin_state=0)
    assert states["replica2"] == ServerState(name="replica2", op_state=2, admin_state=0x08)
    assert states["replica3"] == ServerState(name="replica3", op_state=0, admin_state=0x01)
    assert {n: s.admin_state for n, s in states.items()} == {
        "replica1": 0, "replica2": 8, "replica3": 1, "down1": 0,
        "cfgdis": 5, "cfgdis_ready": 4, "track_drain": 16, "track_maint": 2,
    }


def test_in_rotation_follows_admin_state_only() -> None:
    states = parse_servers_state(CAPTURED)
    in_rotation = sorted(n for n, s in states.items() if s.in_rotation)
    # down1 fails its health checks but is not in maintenance: still in the pool as far as
    # lagwatch is concerned. cfgdis_ready keeps CMAINT (0x04) although it serves again.
    assert in_rotation == ["cfgdis_ready", "down1", "replica1"]


@pytest.mark.parametrize("admin_state,expected", [
    (0x00, True),
    (0x01, False),  # FMAINT
    (0x02, False),  # IMAINT
    (0x04, True),   # CMAINT alone: configured disabled, then "state ready"
    (0x05, False),  # CMAINT | FMAINT: configured disabled
    (0x08, False),  # FDRAIN
    (0x10, False),  # IDRAIN
    (0x20, False),  # RMAINT
    (0x40, True),   # HMAINT: the FQDN was changed at runtime, not a maintenance state
    (0x09, False),
])
def test_in_rotation_bits(admin_state: int, expected: bool) -> None:
    assert ServerState(name="s", op_state=2, admin_state=admin_state).in_rotation is expected


def test_columns_found_by_header_name() -> None:
    text = "1\n# srv_admin_state srv_name extra srv_op_state\n8 a x 2\n0 b y 0\n"
    assert parse_servers_state(text) == {
        "a": ServerState(name="a", op_state=2, admin_state=8),
        "b": ServerState(name="b", op_state=0, admin_state=0),
    }


def test_empty_backend() -> None:
    assert parse_servers_state("1\n" + _HEADER + "\n\n") == {}


def test_later_comment_lines_ignored() -> None:
    text = "1\n" + _HEADER + "\n# a comment\n" + CAPTURED.splitlines()[2] + "\n"
    assert list(parse_servers_state(text)) == ["replica1"]


@pytest.mark.parametrize("text,message", [
    ("Can't find backend.\n\n", "Can't find backend."),
    ("", "empty answer"),
    ("Permission denied\n\n", "Permission denied"),
    ("1\n2 pg_read 1 replica1 127.0.0.1 2 0\n", "no '# be_id be_name ...' header"),
    ("1\n", "no '# be_id be_name ...' header"),
    ("1\n# be_id srv_name srv_op_state\n2 a 2\n", "lacks column(s) srv_admin_state"),
    ("1\n# srv_name srv_op_state srv_admin_state\na 2\n", "line 3 has 2 fields, header has 3"),
    ("1\n# srv_name srv_op_state srv_admin_state\na 2 x\n", "bad state numbers for server 'a'"),
    ("1\n# srv_name srv_op_state srv_admin_state\na 2 0\na 2 1\n", "server 'a' twice"),
])
def test_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_servers_state(text)
    assert message in str(info.value)


def test_routes_for_ignores_members_without_a_server() -> None:
    """A member with no HAProxy server mapped (say the fallback primary) cannot be routed
    to; counting it would make lagwatch re-apply the same pool every cycle."""
    config = HAProxyPoolerConfig(kind="haproxy", socket=Path("/nonexistent.sock"), backend="pg_ro",
                                 servers={"replica1": "r1", "replica2": "r2"})
    pooler = HAProxyPooler(config)
    assert pooler.routes_for(frozenset({"replica1", "primary"}), None) == frozenset({"replica1"})
    # Nothing left to route to: the backend stays as it is, never emptied.
    assert pooler.routes_for(frozenset(), frozenset({"replica2"})) == frozenset({"replica2"})
    assert pooler.routes_for(frozenset({"primary"}), frozenset({"replica1", "replica2"})) == {"replica1", "replica2"}
