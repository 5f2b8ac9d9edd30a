"""How the suite runs: two streams on a 2-core machine, and its order.

Both streams are pytest-xdist workers (``-n 2 --dist loadgroup``, setup.cfg), and the
integration tests (real servers, started by the fixtures) are split between them in two
groups, each run one module after another in one worker:

- ``integration``: the tests that judge lag, timing or the host's speed against an oracle
  (milliseconds, cycles' overruns, a forecast's percent), those most sensitive to a busy
  host last (LAST: by then the other worker is done, or nearly);
- ``integration-side``: those that judge no lag, timing or host speed (reloads, hostile
  input, grants, the pooler files, the demo's lifecycle, Patroni's members, a fleet's
  sessions and shards, the heartbeat's writer, the formats, alerts counted in cycles,
  bytes against pg_walinspect), SIDE, then the unit, property and static tests (~3
  minutes of one core).

The two run beside each other as a CPU-bound neighbour would (every timing test is run
beside one before it lands); each worker starts its own servers, on ports the other's
picks do not take (demo/ports.py). The package builds run at nice 19 in the timing
worker (tests/integration/prebuilt.py), and the package modules come near the end there
(before test_cli_process and test_lag_field). Hypothesis has no
deadline: an example's wall time on a shared host says nothing.

``-n 0`` runs everything in one process: the tests that need no server first (the
builds beside them, in the background), then the side modules, then the timing ones.

``LAGWATCH_TEST_ORDER=reversed`` runs each part in reverse order (the tests within each
module, and the timing modules between the first and LAST; SIDE's order and LAST's are
kept): a test that passes only after another has run, or only on a server a
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
GROUPS = ("integration", "integration-side")
# The side group's modules, in their order. With the unit stream after them, some as long
# as the timing group: a module's tests that judge no timing were moved here from timing
# modules (test_fleet_membership, test_heartbeat_writer) when the timing group ran 897 s
# against the side worker's 622 s (2026-11-29), the whole run waiting on the timing worker.
# Not the package modules: beside the timing group their installs (apt-get, dpkg) came
# with two failures there (below), and they run near the end of the timing group, as
# before the split.
# test_versions judges each major's headline against the oracle: a timing module (beside
# the timing group it read two of 47 readings over the oracle's cap, see docs/development.md).
SIDE = ("test_config_corpus.py", "test_hostile_doors.py", "test_web_security.py", "test_wire.py",
        "test_fleet_membership.py", "test_heartbeat_writer.py", "test_toml_command_poolers.py",
        "test_localcluster.py", "test_least_privilege.py", "test_http_hostile.py", "test_demo.py",
        "test_archiving.py", "test_patroni.py", "test_observability_e2e.py", "test_exposition.py",
        "test_wal_compression.py", "test_vacuum_horizon.py", "test_view_cadence.py", "test_failover.py",
        "test_systemd.py")
# The timing group's last modules, in their order, after the rest (alphabetical): those a
# busy host has failed before (test_lag_field's big transaction, its under-read share over
# 2 % on a slow day and beside the side worker's unit stream; test_cli_process's 50 ms
# interval counting 22 overruns in 125 cycles beside the unit stream and a CPU-bound
# process at once; test_why_behind's held WAL not named "network" in 10 s beside the side
# worker's package installs), run when the side worker is done or nearly; the package
# modules, which assert on what was built in the background meanwhile (prebuilt.py), are
# placed before the last two, so that test_cli_process and test_lag_field come after the
# side worker's end (some two minutes before the timing group's). In the last run with the
# package modules in the side group, test_walinspector's inspection ended 4 kB past the
# flush position the test read and test_why_behind's held WAL was named network with no
# bytes written, both while the side worker installed the package.
LAST = ("test_why_behind.py", "test_lag_truth.py", "test_forecasts.py", "test_packaging.py", "test_debian_package.py",
        "test_cli_process.py", "test_lag_field.py")


def _module(item: pytest.Item) -> str:
    return item.nodeid[len(INTEGRATION):].split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    order = os.environ.get("LAGWATCH_TEST_ORDER", "")
    if order and order != "reversed":
        raise pytest.UsageError(f"LAGWATCH_TEST_ORDER={order!r}: only 'reversed' is known")
    others = [item for item in items if not item.nodeid.startswith(INTEGRATION)]
    integration = [item for item in items if item.nodeid.startswith(INTEGRATION)]
    for item in integration:
        item.add_marker(pytest.mark.xdist_group(GROUPS[1] if _module(item) in SIDE else GROUPS[0]))
    if order == "reversed":
        others.reverse()
        integration.reverse()

    def place(item: pytest.Item) -> tuple[int, int]:
        name = _module(item)
        if name in SIDE:
            return 0, SIDE.index(name)
        return 1, LAST.index(name) + 1 if name in LAST else 0

    # Stable: the order within each module (and among the rest) is kept, reversed or not;
    # SIDE's order and LAST's place are kept reversed too (the package modules wait for
    # the builds, the host-sensitive modules for the side worker's end).
    integration.sort(key=place)
    items[:] = [*others, *integration]


def pytest_collection_finish(session: pytest.Session) -> None:
    # Under xdist the groups' marks must have been read (each nodeid ends "@" and its
    # group): without them a group's modules would be spread over both workers, and the
    # timing ones would run beside each other.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        split = [i.nodeid for i in session.items
                 if i.nodeid.startswith(INTEGRATION) and i.nodeid.rsplit("@", 1)[-1] not in GROUPS]
        if split:
            raise pytest.UsageError(f"integration tests outside the xdist groups {GROUPS}: {split[:3]}")
