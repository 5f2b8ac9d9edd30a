"""The PgBouncer include file, rendered purely."""

from pathlib import Path
from typing import Literal

import pytest
from lagwatch.config import PgBouncerPoolerConfig
from lagwatch.poolers.base import PRIMARY, Backend, PoolerError
from lagwatch.poolers.pgbouncer import HEADER, PgBouncerPooler, render

BACKENDS = {
    "replica1": Backend("replica1", "10.0.0.12", 5432),
    "replica2": Backend("replica2", "10.0.0.11", 5432),
    "replica3": Backend("replica3", "10.0.0.13", 6432),
    PRIMARY: Backend(PRIMARY, "10.0.0.10", 5433),
}


def test_hosts_sorted_so_an_unchanged_pool_is_byte_identical() -> None:
    a = render("app_ro", frozenset({"replica1", "replica2"}), BACKENDS, "port=5432 dbname=app")
    b = render("app_ro", frozenset({"replica2", "replica1"}), BACKENDS, "dbname=app port=5432")
    assert a == b == HEADER + "app_ro = host=10.0.0.11,10.0.0.12 port=5432 dbname=app\n"


def test_primary_alone_uses_its_own_port() -> None:
    text = render("app_ro", frozenset({PRIMARY}), BACKENDS, "port=5432 dbname=app")
    assert text.endswith("app_ro = host=10.0.0.10 port=5433 dbname=app\n")


def test_mixed_ports_and_empty_pools_are_refused() -> None:
    with pytest.raises(PoolerError, match="one port per database entry"):
        render("app_ro", frozenset({"replica1", "replica3"}), BACKENDS, "port=5432 dbname=app")
    with pytest.raises(PoolerError, match="empty host list"):
        render("app_ro", frozenset(), BACKENDS, "dbname=app")
    with pytest.raises(PoolerError, match="no host known for ghost"):
        render("app_ro", frozenset({"ghost"}), BACKENDS, "dbname=app")


@pytest.mark.parametrize(("when_empty", "members", "current", "routes"), [
    ("primary", {"replica1"}, {"replica1", "replica2"}, {"replica1"}),
    ("primary", set(), {"replica1"}, {PRIMARY}),  # never an empty host=: the primary takes the reads
    ("primary", set(), None, {PRIMARY}),
    ("keep", set(), {"replica1"}, {"replica1"}),  # the entry stays as it is
    ("keep", set(), None, set()),  # unknown: try, and let apply_pool say why it cannot
])
def test_routes_for_says_what_pgbouncer_will_report(when_empty: Literal["primary", "keep"], members: set[str],
                                                     current: set[str] | None, routes: set[str]) -> None:
    """What read_pool will say after the apply: comparing against it is what keeps an
    all-ejected pool from being re-applied every cycle."""
    config = PgBouncerPoolerConfig(kind="pgbouncer", admin_dsn="host=127.0.0.1 port=6432 dbname=pgbouncer",
                                   include_file=Path("/nonexistent/lagwatch.ini"), database="app_ro",
                                   when_empty=when_empty)
    pooler = PgBouncerPooler(config, BACKENDS)
    got = pooler.routes_for(frozenset(members), None if current is None else frozenset(current))
    assert got == frozenset(routes)
