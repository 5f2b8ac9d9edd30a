"""systemd's notify protocol: one datagram on $NOTIFY_SOCKET, no dependency needed.

Outside systemd (no NOTIFY_SOCKET) every call is a no-op.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger("lagwatch.sdnotify")


class Notifier:
    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        # An address starting with '@' is in the abstract namespace.
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.watchdog_seconds = _watchdog_seconds(env)

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

    def watchdog(self, status: str) -> None:
        self.send("WATCHDOG=1", f"STATUS={_one_line(status)}")

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
