"""systemd's notify protocol: one datagram on $NOTIFY_SOCKET, no dependency needed.

Outside systemd (no NOTIFY_SOCKET) every call is a no-op.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger("lagwatch.serve.sdnotify")


class Notifier:
    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        # An address starting with '@' is in the abstract namespace.
        self.address = "\0" + address[1:] if address.startswith("@") else address
        # The budget systemd gave (WatchdogSec=), and the one in force after any extension.
        self.configured_watchdog_seconds = _watchdog_seconds(env)
        self.watchdog_seconds = self.configured_watchdog_seconds

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *fields: str) -> bool:
        if not self.address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto("\n".join(fields).encode(), self.address)
            return True
        except OSError as exc:
            log.debug("sd_notify failed: %s", exc)
            return False

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={_one_line(status)}")

    def ensure_watchdog(self, needed: float) -> float | None:
        """Make the watchdog budget at least ``needed`` seconds: ``WATCHDOG_USEC=`` (systemd
        236+) changes the unit's WatchdogSec= at runtime. The budget never goes below what
        the unit configured; a later call with a smaller need (a reload to a shorter interval)
        goes back down to that. Logs each change once. Returns the budget now in force, or
        None without a watchdog."""
        configured = self.configured_watchdog_seconds
        if configured is None or not self.enabled:
            return self.watchdog_seconds
        usec = max(round(configured * 1_000_000), math.ceil(needed * 1_000_000))
        wanted = usec / 1_000_000
        if self.watchdog_seconds is not None and round(self.watchdog_seconds * 1_000_000) == usec:
            return self.watchdog_seconds
        if not self.send(f"WATCHDOG_USEC={usec}"):
            log.warning("WatchdogSec=%gs is under what the interval needs (%gs: 11 intervals plus the query "
                        "timeout), and systemd could not be told: a slow cycle will get lagwatch restarted",
                        configured, needed)
            return self.watchdog_seconds
        if wanted > configured:
            log.info("watchdog: WatchdogSec=%gs is under what the interval needs (11 intervals plus the query "
                     "timeout); extended to %gs (WATCHDOG_USEC=%d)", configured, wanted, usec)
        else:
            log.info("watchdog: back to the unit's WatchdogSec=%gs (WATCHDOG_USEC=%d)", configured, usec)
        self.watchdog_seconds = wanted
        return wanted

    def watchdog(self, status: str) -> None:
        self.send("WATCHDOG=1", f"STATUS={_one_line(status)}")

    def cycle(self, first: bool, status: str, any_up: bool) -> None:
        """A cycle ended: READY=1 after the first. The watchdog is only fed while polling
        works: if no node has answered for longer than WatchdogSec, systemd restarts
        lagwatch (a fresh start may well fix it)."""
        if not self.enabled:
            return
        if first:
            self.ready(status)
        if any_up:
            self.watchdog(status)
        else:
            self.status(f"no node answered the last poll; {status}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={_one_line(status)}")

    def reloading(self) -> None:
        # MONOTONIC_USEC lets systemd (253+, Type=notify-reload) match the reload to this message.
        self.send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}",
                  "STATUS=reloading the config")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=stopping")


def _watchdog_seconds(env: Mapping[str, str]) -> float | None:
    usec = env.get("WATCHDOG_USEC")
    pid = env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 1_000_000
    except ValueError:
        return None


def _one_line(text: str) -> str:
    return " ".join(text.split())[:400]
