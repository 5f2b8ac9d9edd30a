"""The PgBouncer include file, rendered purely."""

import pytest
from lagwatch.poolers.base import PRIMARY, Backend, PoolerError
from lagwatch.poolers.pgbouncer import HEADER, render

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
