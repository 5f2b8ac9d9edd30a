"""Suite-wide options.

The tests that need no server run first, then the integration tests.
``LAGWATCH_TEST_ORDER=reversed`` runs each of the two in reverse order (modules, and tests
within them): a test that passes only after another has run, or only on a server a
neighbour left warm, shows up as a failure in one of the two orders. docs/development.md
says how the suite is run repeatedly to find such tests.
"""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The tests that need no server first: the package builds run beside them
    # (tests/integration/prebuilt.py), off the clock of the tests that measure lag.
    order = os.environ.get("LAGWATCH_TEST_ORDER", "")
    if order and order != "reversed":
        raise pytest.UsageError(f"LAGWATCH_TEST_ORDER={order!r}: only 'reversed' is known")
    groups: tuple[list[pytest.Item], list[pytest.Item]] = ([], [])
    for item in items:
        groups[item.nodeid.startswith("tests/integration/")].append(item)
    for group in groups:
        if order == "reversed":
            group.reverse()
    items[:] = [*groups[0], *groups[1]]
