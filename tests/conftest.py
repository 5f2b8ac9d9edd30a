"""How the suite runs: two streams on a 2-core machine, and its order.

The integration tests (real servers, lag measured against oracles, in milliseconds) run
one after another in one pytest-xdist worker (``-n 2 --dist loadgroup``, setup.cfg: they
are one group); everything else (the unit, property and static tests, ~2.5 minutes of one
core) runs in the other worker beside the first integration modules, those that judge no
lag, timing or host speed (LIGHT_FIRST). The package builds run at nice 19
(tests/integration/prebuilt.py) on the CPU left idle, and the package modules come last.
Hypothesis has no deadline: an example's wall time on a shared host says nothing.

``-n 0`` runs everything in one process: the tests that need no server first (the
builds beside them, in the background), then the integration tests.

``LAGWATCH_TEST_ORDER=reversed`` runs each part in reverse order (modules, and tests
within them): a test that passes only after another has run, or only on a server a
neighbour left warm, shows up as a failure in one of the two orders. docs/development.md
says how the suite is run repeatedly to find such tests.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("lagwatch", deadline=None)
settings.load_profile("lagwatch")

INTEGRATION = "tests/integration/"
# The integration modules that judge no lag, timing or host speed, first: each checks what
# lagwatch says or does (reloads, hostile input, grants, the pooler files, the demo's
# lifecycle, Patroni's members, counted in cycles), so the unit stream running beside
# them early in the session costs them nothing they measure. Some 3.5 minutes of them:
# about as long as the unit stream takes.
LIGHT_FIRST = ("test_config_corpus.py", "test_hostile_doors.py", "test_web_security.py", "test_wire.py",
               "test_toml_command_poolers.py", "test_localcluster.py", "test_least_privilege.py",
               "test_http_hostile.py", "test_demo.py", "test_archiving.py", "test_patroni.py")
# Last: test_cli_process's 50 ms interval counts overruns against the host's speed (it
# failed beside the unit stream and a CPU-bound process at once: 22 of 125 cycles); the
# package modules assert on what is built in the background meanwhile (prebuilt.py).
LAST = ("test_cli_process.py", "test_packaging.py", "test_debian_package.py")


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    order = os.environ.get("LAGWATCH_TEST_ORDER", "")
    if order and order != "reversed":
        raise pytest.UsageError(f"LAGWATCH_TEST_ORDER={order!r}: only 'reversed' is known")
    others = [item for item in items if not item.nodeid.startswith(INTEGRATION)]
    integration = [item for item in items if item.nodeid.startswith(INTEGRATION)]
    for item in integration:
        item.add_marker(pytest.mark.xdist_group("integration"))  # one worker, one at a time
    if order == "reversed":
        others.reverse()
        integration.reverse()

    def place(item: pytest.Item) -> int:
        name = item.nodeid[len(INTEGRATION):].split("::", 1)[0]
        if name in LIGHT_FIRST:
            return LIGHT_FIRST.index(name)
        return len(LIGHT_FIRST) + 1 + LAST.index(name) if name in LAST else len(LIGHT_FIRST)

    integration.sort(key=place)  # stable: the order within each module is kept
    items[:] = [*others, *integration]


def pytest_collection_finish(session: pytest.Session) -> None:
    # Under xdist the group's marks must have been read (its nodeids end "@integration"):
    # without them the integration tests would run in both workers at once, each with its
    # own servers, beside each other.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        split = [i.nodeid for i in session.items if i.nodeid.startswith(INTEGRATION) and "@integration" not in i.nodeid]
        if split:
            raise pytest.UsageError(f"integration tests outside the xdist group 'integration': {split[:3]}")
