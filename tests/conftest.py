"""How the suite runs: two streams on a 2-core machine, and its order.

The integration tests (real servers, lag measured against oracles, in milliseconds) run
one after another in one pytest-xdist worker (``-n 2 --dist loadgroup``, setup.cfg: they
are one group); everything else (the unit, property and static tests, ~2.5 minutes of
CPU) runs in the other worker beside them, at the lowest CPU priority (nice 19), as do the
package builds (tests/integration/prebuilt.py): they take the CPU the integration tests
leave idle, never the CPU those tests' servers and lagwatch need. On this VM that takes
the whole run from ~25 to ~20 minutes with no test's own timing changed. Hypothesis has no
deadline here for the same reason: a deprioritised example's wall time says nothing.

``-n 0`` (or ``-p no:xdist``) runs everything in one process: the tests that need no
server first (the builds beside them, in the background), then the integration tests.

Within the integration tests, the modules that measure no lag come first (LIGHT_FIRST):
they run while the CPU-bound work beside them is still going.

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
# The integration modules that judge no lag or timing against an oracle, first: each
# checks what lagwatch says or does (exit codes, reloads, hostile input, the units, the
# package), so the CPU-bound work running beside them early in the session costs them
# nothing they measure. The package modules come last of them: their builds run meanwhile.
LIGHT_FIRST = ("test_config_corpus.py", "test_cli_process.py", "test_hostile_doors.py", "test_web_security.py",
               "test_wire.py", "test_toml_command_poolers.py", "test_localcluster.py", "test_least_privilege.py",
               "test_systemd.py", "test_demo.py", "test_versions.py", "test_packaging.py", "test_debian_package.py")
NICE = 19


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

    def light_first(item: pytest.Item) -> int:
        name = item.nodeid[len(INTEGRATION):].split("::", 1)[0]
        return LIGHT_FIRST.index(name) if name in LIGHT_FIRST else len(LIGHT_FIRST)

    integration.sort(key=light_first)  # stable: the order within each module is kept
    items[:] = [*others, *integration]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """nice 19 for a test that needs no server while the integration tests run beside it
    (an xdist worker), 0 for an integration test: set before the test's fixtures, so that
    servers a fixture starts (and keeps for the session) are never born deprioritised.
    Only where the priority can be raised back (root): a worker that runs both kinds must
    not run an integration test at nice 19."""
    if os.environ.get("PYTEST_XDIST_WORKER") and os.geteuid() == 0:
        wanted = 0 if item.nodeid.startswith(INTEGRATION) else NICE
        if os.getpriority(os.PRIO_PROCESS, 0) != wanted:
            os.setpriority(os.PRIO_PROCESS, 0, wanted)
