"""Suite-wide options.

``LAGWATCH_TEST_ORDER=reversed`` runs the collected tests in reverse order (modules, and
tests within them): a test that passes only after another has run, or only on a server a
neighbour left warm, shows up as a failure in one of the two orders. docs/development.md
says how the suite is run repeatedly to find such tests.
"""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    order = os.environ.get("LAGWATCH_TEST_ORDER", "")
    if order == "reversed":
        items.reverse()
    elif order:
        raise pytest.UsageError(f"LAGWATCH_TEST_ORDER={order!r}: only 'reversed' is known")
