"""A reload: the config file (and its web config) read again and put in force whole, or not
at all.

What it is to put a config in force (its sources beside the running ones, a runtime built
from them, the swap, the schedule) is the daemon's; this is the rest of the protocol an
operator sees: systemd told it is reloading and then ready again, a file that does not
validate or a config that cannot be built rejected with one log line naming every problem
and the running config kept, and the outcome kept for the metrics
(``lagwatch_config_last_reload_successful`` and its time, as Prometheus exports its own).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from lagwatch.config import Config, load_config
from lagwatch.durations import format_duration
from lagwatch.errors import ConfigError
from lagwatch.estimate.cyclestats import watchdog_budget
from lagwatch.serve.sdnotify import Notifier

log = logging.getLogger("lagwatch.reload")

# Puts a validated config in force, or raises ConfigError (what the schema could not see,
# such as a runtime that cannot be built from it) and changes nothing. Anything else it
# raises comes after the config was put in force (closing what it replaced): not a
# rejection, and not caught here.
PutInForce = Callable[[Config], Awaitable[None]]


class ConfigReload:
    def __init__(self, path: Path | None, web_config_file: Path | None, notifier: Notifier,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.web_config_file = web_config_file  # the command line's, read again on each reload
        self.notifier = notifier
        self._clock = clock
        self.ok = True  # the last reload's outcome
        self.success_at = clock()  # the config loaded at start counts, as in Prometheus

    async def __call__(self, put_in_force: PutInForce) -> bool:
        """Read the file again and put it in force with ``put_in_force``; False (and nothing
        changed) when the file does not validate or the config cannot be put in force."""
        if self.path is None:
            log.warning("reload requested but lagwatch was not started from a config file")
            return False
        self.notifier.reloading()
        try:
            new = load_config(self.path, self.web_config_file)
            await put_in_force(new)
        except ConfigError as exc:
            return self._rejected(str(exc))
        self.ok, self.success_at = True, self._clock()
        log.info("reloaded %s: %d cluster(s), interval %s", self.path, len(new.clusters),
                 format_duration(new.interval))
        # The interval may have changed, and with it how long a cycle may take.
        self.notifier.ensure_watchdog(watchdog_budget(new.interval, new.effective_query_timeout))
        self.notifier.ready(f"reloaded {self.path}")
        return True

    def _rejected(self, problems: str) -> bool:
        self.ok = False
        log.error("reload rejected, keeping the running config: %s", problems)
        self.notifier.ready("reload rejected, running the previous config")
        return False
