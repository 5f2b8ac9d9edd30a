"""The PgCat/PgDog renderers: only the pool's replica list changes, every other byte stays."""

from __future__ import annotations

import itertools
import tomllib
from typing import Any

import pytest
from lagwatch.config import check_template
from lagwatch.poolers import pgcat, pgdog
from lagwatch.poolers.base import Backend, PoolerError
from lagwatch.poolers.command import render

render_pgcat, render_pgdog = pgcat.render, pgdog.render


def replica_addresses(kind: str, text: str, pool: str) -> list[tuple[str, int]]:
    return {"pgcat": pgcat, "pgdog": pgdog}[kind].replica_addresses(text, pool)


PRIMARY = Backend("primary", "10.0.0.1", 5432)
R2 = Backend("replica2", "10.0.0.2", 5432)
R3 = Backend("replica3", "10.0.0.3", 5432)
R4 = Backend("replica4", "10.0.0.4", None)  # no port in the DSN: 5432
R10 = Backend("replica10", "10.0.0.10", 6432)

# PgCat's documented shape: [general], pools with users and shards; "app" has one shard.
PGCAT = """\
#
# PgCat config for the app cluster.
#
[general]
host = "0.0.0.0"
port = 6432
admin_username = "admin"
admin_password = "s3cret, really [not]"

# A sharded pool: lagwatch must refuse it.
[pools.sharded_db]
pool_mode = "transaction"
default_role = "any"

[pools.sharded_db.users.0]
username = "sharding_user"
password = "sharding_user"
pool_size = 9

[pools.sharded_db.shards.0]
servers = [
    [ "127.0.0.1", 5432, "primary" ],
    [ "localhost", 5432, "replica" ]
]
database = "shard0"

[pools.sharded_db.shards.1]
servers = [
    [ "127.0.0.1", 5432, "primary" ],
    [ "localhost", 5432, "replica" ],
]
database = "shard1"

[pools.app]
pool_mode = "transaction"
default_role = "replica"   # reads go to [replicas]
query_parser_enabled = true
primary_reads_enabled = false

[pools.app.users.0]
username = "app"
password = "app, pw ]"
pool_size = 20

# Shard 0
[pools.app.shards.0]
# [ host, port, role ]
servers = [
    # the primary, never touched by lagwatch
    [ "10.0.0.1", 5432, "primary" ], # writes [and reads]
    [ "10.0.0.3", 5432, "replica" ], # zone c
    # [ "10.0.0.9", 5432, "replica" ], decommissioned, "kept" as a comment
    [ "10.0.0.2", 5432, "replica" ]
]
database = "app [main], eu"
mirrors = [ [ "10.0.0.8", 5432, 0 ] ]

[pools.other.shards.0]
servers = [ [ "10.1.0.1", 5432, "primary" ], [ "10.1.0.2", 5432, "replica" ] ]
database = "other"
"""

PGCAT_APP_ARRAY = """\
servers = [
    # the primary, never touched by lagwatch
    [ "10.0.0.1", 5432, "primary" ], # writes [and reads]
    [ "10.0.0.3", 5432, "replica" ], # zone c
    # [ "10.0.0.9", 5432, "replica" ], decommissioned, "kept" as a comment
    [ "10.0.0.2", 5432, "replica" ]
]
"""


def pgcat_with_array(array: str) -> str:
    assert PGCAT.count(PGCAT_APP_ARRAY) == 1
    return PGCAT.replace(PGCAT_APP_ARRAY, array)


def test_pgcat_example_is_read() -> None:
    assert replica_addresses("pgcat", PGCAT, "app") == [("10.0.0.3", 5432), ("10.0.0.2", 5432)]
    assert replica_addresses("pgcat", PGCAT, "other") == [("10.1.0.2", 5432)]


def test_pgcat_edits_only_the_replica_entries() -> None:
    out = render_pgcat(PGCAT, "app", [R4, R2])
    # 10.0.0.3 leaves with the comment on its line, 10.0.0.2 stays as it was, 10.0.0.4
    # joins after the last server
    assert out == pgcat_with_array("""\
servers = [
    # the primary, never touched by lagwatch
    [ "10.0.0.1", 5432, "primary" ], # writes [and reads]
    # [ "10.0.0.9", 5432, "replica" ], decommissioned, "kept" as a comment
    [ "10.0.0.2", 5432, "replica" ],
    [ "10.0.0.4", 5432, "replica" ]
]
""")
    assert replica_addresses("pgcat", out, "app") == [("10.0.0.2", 5432), ("10.0.0.4", 5432)]
    # everything outside the array is byte-for-byte the same
    start = PGCAT.index(PGCAT_APP_ARRAY)
    end = start + len(PGCAT_APP_ARRAY)
    assert out[:start] == PGCAT[:start]
    assert out.endswith(PGCAT[end:])
    old, new = tomllib.loads(PGCAT), tomllib.loads(out)
    for data in (old, new):
        del data["pools"]["app"]["shards"]["0"]["servers"]
    assert old == new


def test_pgcat_remove_all_replicas_keeps_primary_and_comments() -> None:
    assert render_pgcat(PGCAT, "app", []) == pgcat_with_array("""\
servers = [
    # the primary, never touched by lagwatch
    [ "10.0.0.1", 5432, "primary" ], # writes [and reads]
    # [ "10.0.0.9", 5432, "replica" ], decommissioned, "kept" as a comment
]
""")


def test_pgcat_unchanged_set_is_byte_identical_whatever_the_order() -> None:
    assert render_pgcat(PGCAT, "app", [R2, R3]) == PGCAT
    assert render_pgcat(PGCAT, "app", [R3, R2]) == PGCAT


def test_pgcat_eject_and_readmit_changes_only_that_entry() -> None:
    out = render_pgcat(PGCAT, "app", [R2])
    assert out == PGCAT.replace('    [ "10.0.0.3", 5432, "replica" ], # zone c\n', "")
    back = render_pgcat(out, "app", [R2, R3])
    assert back == pgcat_with_array("""\
servers = [
    # the primary, never touched by lagwatch
    [ "10.0.0.1", 5432, "primary" ], # writes [and reads]
    # [ "10.0.0.9", 5432, "replica" ], decommissioned, "kept" as a comment
    [ "10.0.0.2", 5432, "replica" ],
    [ "10.0.0.3", 5432, "replica" ]
]
""")
    assert render_pgcat(back, "app", [R3, R2]) == back


def test_pgcat_new_entries_are_sorted_by_host_then_port_and_stable() -> None:
    same_host = Backend("replica5", "10.0.0.10", 5433)
    outs = {render_pgcat(PGCAT, "app", list(p)) for p in itertools.permutations([R4, same_host, R10, R2])}
    assert len(outs) == 1
    (out,) = outs
    # 10.0.0.2 was there and stays first; the new ones by host (as a string), then port
    assert replica_addresses("pgcat", out, "app") == [
        ("10.0.0.2", 5432), ("10.0.0.10", 5433), ("10.0.0.10", 6432), ("10.0.0.4", 5432),
    ]


def test_pgcat_primary_fallback_is_a_replica_entry_of_the_primary() -> None:
    out = render_pgcat(PGCAT, "app", [PRIMARY])
    assert out == pgcat_with_array("""\
servers = [
    # the primary, never touched by lagwatch
    [ "10.0.0.1", 5432, "primary" ], # writes [and reads]
    # [ "10.0.0.9", 5432, "replica" ], decommissioned, "kept" as a comment
    [ "10.0.0.1", 5432, "replica" ]
]
""")
    assert replica_addresses("pgcat", out, "app") == [("10.0.0.1", 5432)]


def test_pgcat_other_pools_are_untouched_and_single_line_arrays_work() -> None:
    one_line = 'servers = [ [ "10.1.0.1", 5432, "primary" ], [ "10.1.0.2", 5432, "replica" ] ]'
    out = render_pgcat(PGCAT, "other", [R2, R3])
    assert out == PGCAT.replace(one_line, 'servers = [ [ "10.1.0.1", 5432, "primary" ], '
                                '[ "10.0.0.2", 5432, "replica" ], [ "10.0.0.3", 5432, "replica" ] ]')
    # the separator comma stays with the primary (tomlkit keeps it), which TOML allows
    assert render_pgcat(out, "other", []) == PGCAT.replace(
        one_line, 'servers = [ [ "10.1.0.1", 5432, "primary" ], ]')


def test_pgcat_refuses_a_pool_with_several_shards() -> None:
    with pytest.raises(PoolerError, match=r"shards 1 besides 0"):
        render_pgcat(PGCAT, "sharded_db", [R2])


@pytest.mark.parametrize(("before", "after"), [
    pytest.param(  # primary only, no trailing comma: a comma is added to its line
        'servers = [\n  ["p", 1, "primary"]\n]\n',
        'servers = [\n  ["p", 1, "primary"],\n  ["10.0.0.2", 5432, "replica"],\n  ["10.0.0.3", 5432, "replica"]\n]\n',
        id="append-no-trailing-comma"),
    pytest.param(  # trailing comma style kept for the new last entry
        'servers = [\n\t["p", 1, "primary"],\n]\n',
        'servers = [\n\t["p", 1, "primary"],\n\t["10.0.0.2", 5432, "replica"],\n\t["10.0.0.3", 5432, "replica"],\n]\n',
        id="append-trailing-comma"),
    pytest.param(
        'servers = [\n  ["p", 1, "primary"] ]\n',
        'servers = [\n  ["p", 1, "primary"],\n  ["10.0.0.2", 5432, "replica"],\n  ["10.0.0.3", 5432, "replica"] ]\n',
        id="close-on-last-line"),
    pytest.param(  # replicas listed before the primary: the old one leaves with its comment
        'servers = [\n  ["r", 2, "replica"], # old\n  ["p", 1, "primary"]\n]\n',
        'servers = [\n  ["p", 1, "primary"],\n  ["10.0.0.2", 5432, "replica"],\n  ["10.0.0.3", 5432, "replica"]\n]\n',
        id="replicas-first"),
    pytest.param(
        'servers = [\n]\n',
        'servers = [\n    [ "10.0.0.2", 5432, "replica" ],\n    [ "10.0.0.3", 5432, "replica" ]\n]\n',
        id="empty-multiline"),
    pytest.param('servers = []\n', 'servers = [[ "10.0.0.2", 5432, "replica" ], [ "10.0.0.3", 5432, "replica" ]]\n',
                 id="empty-one-line"),
    pytest.param(
        'servers = [["p",1,"primary"],["r",2,"replica"],]\n',
        'servers = [["p",1,"primary"], ["10.0.0.2", 5432, "replica"], ["10.0.0.3", 5432, "replica"]]\n',
        id="one-line-compact-trailing-comma"),
    pytest.param(  # a server entry spanning lines
        'servers = [\n  [\n    "p", 1, "primary"\n  ],\n  [\n    "r", 2, "replica"\n  ],\n]\n',
        'servers = [\n  [\n    "p", 1, "primary"\n  ],\n  [ "10.0.0.2", 5432, "replica" ],\n'
        '  [ "10.0.0.3", 5432, "replica" ],\n]\n', id="entry-per-lines"),
    pytest.param(  # two servers on one line of a multi-line array
        'servers = [ # inline comment with ] and [\n  [ "p", 1, "primary" ], [ "r", 2, "replica" ],\n]\n',
        'servers = [ # inline comment with ] and [\n  [ "p", 1, "primary" ],\n  [ "10.0.0.2", 5432, "replica" ],\n'
        '  [ "10.0.0.3", 5432, "replica" ],\n]\n', id="two-on-a-line"),
])
def test_pgcat_layouts(before: str, after: str) -> None:
    text = f"[pools.app.shards.0]\ndatabase = \"app\"\n{before}# end\n"
    out = render_pgcat(text, "app", [R3, R2])
    assert out == f"[pools.app.shards.0]\ndatabase = \"app\"\n{after}# end\n"
    assert render_pgcat(out, "app", [R2, R3]) == out


def test_pgcat_crlf_file_keeps_crlf() -> None:
    text = PGCAT.replace("\n", "\r\n")
    out = render_pgcat(text, "app", [R4, R2])
    assert "\n" not in out.replace("\r\n", "")
    assert out == render_pgcat(PGCAT, "app", [R4, R2]).replace("\n", "\r\n")
    assert render_pgcat(out, "app", [R2, R4]) == out


def test_pgcat_quoted_keys_dotted_keys_and_inline_tables() -> None:
    quoted = '[pools."app.v2".shards."0"]\nservers = [\n  [ "p", 1, "primary" ],\n]\n'
    out = render_pgcat(quoted, "app.v2", [R2])
    assert out == ('[pools."app.v2".shards."0"]\nservers = [\n  [ "p", 1, "primary" ],\n'
                   '  [ "10.0.0.2", 5432, "replica" ],\n]\n')
    dotted = ('[pools.app]\npool_mode = "session"\nshards.0.servers = [ [ "p", 1, "primary" ] ]\n'
              'shards.0.database = "x"\n')
    assert render_pgcat(dotted, "app", [R2]) == dotted.replace(
        '[ [ "p", 1, "primary" ] ]', '[ [ "p", 1, "primary" ], [ "10.0.0.2", 5432, "replica" ] ]')
    inline = '[pools.app.shards]\n0 = { servers = [ [ "p", 1, "primary" ] ], database = "é" }\n'
    assert render_pgcat(inline, "app", [R2]) == inline.replace(
        '[ [ "p", 1, "primary" ] ]', '[ [ "p", 1, "primary" ], [ "10.0.0.2", 5432, "replica" ] ]')


def test_pgcat_tricky_values_elsewhere_are_kept() -> None:
    text = '''\
[general]
motd = """
[pools.app.shards.0]
servers = [ [ "evil", 1, "replica" ] ]
"""
note = 'a # not a comment [ ]'
started = 1979-05-27 07:32:00Z
weights = { a = [1, 2,
  3], b = "}" }
greeting = "Grüße, 日本 🐘"

[pools.app.shards.0]
servers = [ # inline comment with ] and [
  [ "p", 1, "primary" ],
]
'''
    out = render_pgcat(text, "app", [R2])
    assert out == text.replace('[ "p", 1, "primary" ],\n',
                               '[ "p", 1, "primary" ],\n  [ "10.0.0.2", 5432, "replica" ],\n')


@pytest.mark.parametrize(("text", "match"), [
    ("[pools.app\n", "not valid TOML"),
    ('[pools.other.shards.0]\nservers = []\n', r"no \[pools.app\]"),
    ('[pools.app]\npool_mode = "session"\n', "shards.0"),
    ('[pools.app.shards.0]\ndatabase = "x"\n', "no servers array"),
    ('[pools.app.shards.0]\nservers = [ [ "p", 1, "standby" ] ]\n', "is not"),
    ('[pools.app.shards.0]\nservers = [ [ "p", "1", "primary" ] ]\n', "is not"),
])
def test_pgcat_invalid_input(text: str, match: str) -> None:
    with pytest.raises(PoolerError, match=match):
        render_pgcat(text, "app", [R2])


def test_pgcat_duplicate_addresses_refused() -> None:
    with pytest.raises(PoolerError, match="same address"):
        render_pgcat(PGCAT, "app", [R2, Backend("alias", "10.0.0.2", 5432)])


# PgDog's documented shape: [general], repeated [[databases]] with name/host/port/role.
PGDOG = """\
# PgDog configuration
[general]
host = "0.0.0.0"
port = 6432
default_pool_size = 10

#
# Databases
#

[[databases]]
name = "prod"
host = "10.0.0.1"
port = 5432
role = "primary"
database_name = "app"

# replica in zone c [will be ejected]
[[databases]]
name = "prod"
host = "10.0.0.3"   # c
port = 5432
role = "replica"
database_name = "app"
user = "app_ro"
shard = 0

# ---- analytics ----

[[databases]]
name = "analytics"
host = "10.2.0.1"

[[databases]]
name = "analytics"
host = "10.2.0.2"
role = "replica"

[admin]
name = "admin"
password = "pw, with [brackets]"
"""

PGDOG_PROD_REPLICA = """\
# replica in zone c [will be ejected]
[[databases]]
name = "prod"
host = "10.0.0.3"   # c
port = 5432
role = "replica"
database_name = "app"
user = "app_ro"
shard = 0

"""


def copied_replica(host: str, port: int = 5432) -> str:
    return f"""\
[[databases]]
name = "prod"
host = "{host}"
port = {port}
role = "replica"
database_name = "app"
user = "app_ro"
shard = 0

"""


def test_pgdog_example_is_read() -> None:
    assert replica_addresses("pgdog", PGDOG, "prod") == [("10.0.0.3", 5432)]
    assert replica_addresses("pgdog", PGDOG, "analytics") == [("10.2.0.2", 5432)]


def test_pgdog_replaces_replica_tables_copying_the_key_layout() -> None:
    out = render_pgdog(PGDOG, "prod", [R4, R10, R2])
    assert out == PGDOG.replace(PGDOG_PROD_REPLICA, copied_replica("10.0.0.10", 6432) + copied_replica("10.0.0.2")
                                + copied_replica("10.0.0.4"))
    assert replica_addresses("pgdog", out, "prod") == [("10.0.0.10", 6432), ("10.0.0.2", 5432), ("10.0.0.4", 5432)]


def test_pgdog_removed_replica_disappears_whole() -> None:
    out = render_pgdog(PGDOG, "prod", [])
    assert out == PGDOG.replace(PGDOG_PROD_REPLICA, "")
    assert "zone c" not in out and "10.0.0.3" not in out
    assert "# ---- analytics ----" in out


def test_pgdog_without_a_replica_table_copies_the_pools_first_table() -> None:
    # With no replica table left, the pool's first (primary) table is the layout: its
    # database_name must not be lost, or the replica would serve another database.
    text = render_pgdog(PGDOG, "prod", [])
    out = render_pgdog(text, "prod", [R2])
    assert out == text.replace('database_name = "app"\n\n', 'database_name = "app"\n\n[[databases]]\nname = "prod"\n'
                               'host = "10.0.0.2"\nport = 5432\nrole = "replica"\ndatabase_name = "app"\n\n', 1)
    # missing port and role lines are added after host
    minimal = '[[databases]]\nname = "db"\nhost = "p"\nuser = "u"\n'
    assert render_pgdog(minimal, "db", [R10]) == minimal + (
        '\n[[databases]]\nname = "db"\nhost = "10.0.0.10"\nport = 6432\nrole = "replica"\nuser = "u"\n')
    # the other database: its replica table is the template
    out = render_pgdog(PGDOG, "analytics", [R3])
    assert out == PGDOG.replace('host = "10.2.0.2"\nrole = "replica"\n', 'host = "10.0.0.3"\nport = 5432\n'
                                'role = "replica"\n')


def test_pgdog_primary_fallback() -> None:
    out = render_pgdog(PGDOG, "prod", [PRIMARY])
    assert out == PGDOG.replace(PGDOG_PROD_REPLICA, copied_replica("10.0.0.1"))
    data = tomllib.loads(out)
    assert [(d["host"], d.get("role")) for d in data["databases"] if d["name"] == "prod"] == [
        ("10.0.0.1", "primary"), ("10.0.0.1", "replica")]


def test_pgdog_unchanged_idempotent_round_trip_and_stable_order() -> None:
    assert render_pgdog(PGDOG, "prod", [R3]) == PGDOG
    once = render_pgdog(PGDOG, "prod", [R2, R4])
    assert render_pgdog(once, "prod", [R4, R2]) == once
    assert render_pgdog(render_pgdog(once, "prod", [R10]), "prod", [R2, R4]) == once
    outs = {render_pgdog(PGDOG, "prod", list(p)) for p in itertools.permutations([R2, R4, R10])}
    assert len(outs) == 1


def test_pgdog_last_table_at_end_of_file_without_newline() -> None:
    text = '[[databases]]\nname = "db"\nhost = "p"\n\n[[databases]]\nname = "db"\nhost = "r"\nrole = "replica"'
    out = render_pgdog(text, "db", [R2, R3])
    assert out == ('[[databases]]\nname = "db"\nhost = "p"\n\n'
                   '[[databases]]\nname = "db"\nhost = "10.0.0.2"\nport = 5432\nrole = "replica"\n\n'
                   '[[databases]]\nname = "db"\nhost = "10.0.0.3"\nport = 5432\nrole = "replica"\n')
    assert render_pgdog(out, "db", [R3, R2]) == out
    assert render_pgdog(out, "db", []) == '[[databases]]\nname = "db"\nhost = "p"\n\n'


def test_pgdog_crlf_file_keeps_crlf() -> None:
    text = PGDOG.replace("\n", "\r\n")
    out = render_pgdog(text, "prod", [R2, R4])
    assert out == render_pgdog(PGDOG, "prod", [R2, R4]).replace("\n", "\r\n")
    assert render_pgdog(out, "prod", [R4, R2]) == out


@pytest.mark.parametrize(("text", "match"), [
    ("[[databases]\n", "not valid TOML"),
    ('[[databases]]\nname = "other"\nhost = "h"\n', "no \\[\\[databases\\]\\] entry"),
    ('[[databases]]\nname = "prod"\nhost = "h"\n[[databases]]\nname = "prod"\nhost = "h2"\nshard = 1\n', "shard"),
    ('[[databases]]\nname = "prod"\nhost = "h"\nrole = "auto"\n', "auto"),
    ('[[databases]]\nname = "prod"\nport = 5432\n', "host must be a string"),
    ('databases = [ { name = "prod", host = "h" } ]\n', "inline"),
    ('[[databases]]\nname = "prod"\nhost = "h"\n[databases.extra]\nx = 1\n', "sub-table"),
])
def test_pgdog_invalid_input(text: str, match: str) -> None:
    with pytest.raises(PoolerError, match=match):
        render_pgdog(text, "prod", [R2])


# The command adapter's template rendering.

BACKENDS = {b.name: b for b in (PRIMARY, R2, R3, R4)}


def test_command_render_is_sorted_and_fills_every_placeholder() -> None:
    template = "# generated\nread = {hosts}\nmembers = {members}\n{backends}\nliteral {{braces}}\n"
    out = render(template, frozenset({"replica4", "primary", "replica2"}), BACKENDS)
    assert out == ("# generated\nread = 10.0.0.1,10.0.0.2,10.0.0.4\nmembers = primary replica2 replica4\n"
                   "primary 10.0.0.1:5432\nreplica2 10.0.0.2:5432\nreplica4 10.0.0.4:5432\nliteral {braces}\n")
    assert render(template, frozenset(), BACKENDS) == "# generated\nread = \nmembers = \n\nliteral {braces}\n"


@pytest.mark.parametrize(("template", "match"), [
    ("servers = {servers}", r"unknown placeholder \{servers\}"),
    ("servers = {}", "positional"),
    ("servers = {0}", "positional"),
    ("servers = {members", "not a valid format string"),
    ("servers = {members.upper}", r"unknown placeholder \{members.upper\}"),
    ("servers = {members:{x}}", r"unknown placeholder \{x\}"),
    ("servers = {members!z}", "not a valid format string"),
])
def test_command_bad_template_is_a_config_error(template: str, match: str) -> None:
    """The template is checked when the config loads, as run would use it."""
    with pytest.raises(ValueError, match=match):
        check_template(template)


def test_command_render_unknown_member() -> None:
    with pytest.raises(PoolerError, match="replica9"):
        render("{members}", frozenset({"replica9"}), BACKENDS)


# Every transition between replica sets of a few layouts: the result holds exactly the
# wanted replicas and is a fixed point, and whatever the history, taking every replica out
# gives the same bytes as taking them out of the original file: nothing but replica
# entries was ever changed, added or lost (comments and blank lines included). Two layouts
# keep a trace of an entry added once (marked not exact, and compared as data there): an
# array closed on its last entry's line gets its bracket on a line of its own (tomlkit's
# layout), and a file that ended without a newline gains one.
SUBSETS = [list(c) for n in range(4) for c in itertools.combinations([PRIMARY, R2, R10], n)]
LAYOUTS = [
    pytest.param(render_pgcat, PGCAT, "app", id="pgcat-multiline"),
    pytest.param(render_pgcat, PGCAT, "other", id="pgcat-one-line"),
    pytest.param(render_pgcat, PGCAT.replace("\n", "\r\n"), "app", id="pgcat-crlf"),
    pytest.param(render_pgcat, '[pools.app.shards.0]\nservers = [\n  ["p", 1, "primary"] ]\n', "app",
                 id="pgcat-close-on-line", marks=pytest.mark.not_exact),
    pytest.param(render_pgcat, '[pools.app.shards.0]\nservers = [ # [\n  ["r", 2, "replica"],\n\n  # x\n  ["p", 1, '
                 '"primary"], # p\n  ]\n', "app", id="pgcat-replicas-first-trailing-comma"),
    pytest.param(render_pgdog, PGDOG, "prod", id="pgdog"),
    pytest.param(render_pgdog, PGDOG, "analytics", id="pgdog-other"),
    pytest.param(render_pgdog, PGDOG.replace("\n", "\r\n"), "prod", id="pgdog-crlf"),
    pytest.param(render_pgdog, '[[databases]]\nname = "prod"\nhost = "p"', "prod", id="pgdog-no-final-newline",
                 marks=pytest.mark.not_exact),
]


@pytest.mark.parametrize(("renderer", "base", "pool"), LAYOUTS)
def test_every_transition(renderer: Any, base: str, pool: str, request: pytest.FixtureRequest) -> None:
    exact = request.node.get_closest_marker("not_exact") is None
    kind = "pgcat" if renderer is render_pgcat else "pgdog"
    bare = renderer(base, pool, [])
    for a in SUBSETS:
        once = renderer(base, pool, a)
        assert sorted(replica_addresses(kind, once, pool)) == sorted((b.host, b.port or 5432) for b in a)
        assert renderer(once, pool, a[::-1]) == once
        for b in SUBSETS:
            twice = renderer(once, pool, b)
            assert sorted(replica_addresses(kind, twice, pool)) == sorted((r.host, r.port or 5432) for r in b)
            assert renderer(twice, pool, b) == twice
            if exact:
                assert renderer(twice, pool, []) == bare, (a, b)
            else:
                assert tomllib.loads(renderer(twice, pool, [])) == tomllib.loads(bare), (a, b)
