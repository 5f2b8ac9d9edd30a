"""The path to the pager without production's patience, for the tests that wait on it
(test_observability_e2e.py, test_why_behind.py): Prometheus evaluating the rules more
often, Alertmanager grouping sooner. The rules' ``for:``s are shortened by
prom_stack.rules_with_shorter_for; the routes, receivers and inhibitions stay the shipped
example's.

The scrape interval is left at prom_stack's 1 s: a scrape that timed out marks every
series of the target stale, which resets a pending alert, and a lagwatch's /metrics is not
instant on a busy host.
"""

from __future__ import annotations

import yaml
from prom_stack import Prometheus

EVALUATION_INTERVAL = "500ms"  # a for: is judged at evaluations: each wait on one ends up to one late
GROUP_WAIT = "1s"  # Alertmanager's group_wait and group_interval ("resolved" is sent at the next)


def quicker_grouping(config_text: str, wait: str = GROUP_WAIT) -> str:
    """prom_stack.alertmanager_config's text with group_wait and group_interval of ``wait``."""
    config = yaml.safe_load(config_text)
    config["route"].update(group_wait=wait, group_interval=wait)
    return yaml.safe_dump(config)


def evaluate_every(prometheus: Prometheus, interval: str = EVALUATION_INTERVAL) -> None:
    """Before it starts: Prometheus evaluates its rules every ``interval``."""
    config = yaml.safe_load(prometheus.config_file.read_text())
    config["global"]["evaluation_interval"] = interval
    prometheus.config_file.write_text(yaml.safe_dump(config))
