"""sd_notify on a real datagram socket: the watchdog budget follows what the interval needs."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import pytest
from lagwatch.serve.sdnotify import Notifier


def received(s: socket.socket) -> list[dict[str, str]]:
    out = []
    while True:
        try:
            data = s.recv(4096)
        except BlockingIOError:
            return out
        out.append(dict(line.split("=", 1) for line in data.decode().splitlines()))


def notifier(s: socket.socket, **env: str) -> Notifier:
    return Notifier({"NOTIFY_SOCKET": s.getsockname(), **env})


def test_budget_raised_once_then_back_down(sock: socket.socket, caplog: pytest.LogCaptureFixture) -> None:
    n = notifier(sock, WATCHDOG_USEC="2000000")
    assert n.watchdog_seconds == 2.0
    with caplog.at_level(logging.INFO, logger="lagwatch.serve.sdnotify"):
        assert n.ensure_watchdog(3 * 3 + 2.4) == pytest.approx(11.4)
        assert n.ensure_watchdog(3 * 3 + 2.4) == pytest.approx(11.4)  # nothing new to say
    assert received(sock) == [{"WATCHDOG_USEC": "11400000"}]
    assert [r.getMessage() for r in caplog.records if "extended to 11.4s" in r.getMessage()] != []
    assert len(caplog.records) == 1
    # A shorter interval after a reload: back to the unit's WatchdogSec, never below it.
    assert n.ensure_watchdog(0.95) == 2.0
    assert received(sock) == [{"WATCHDOG_USEC": "2000000"}]
    n.ensure_watchdog(3 * 60 + 48)
    n.ready("reloaded")
    assert received(sock) == [{"WATCHDOG_USEC": "228000000"}, {"READY": "1", "STATUS": "reloaded"}]


def test_enough_budget_sends_nothing(sock: socket.socket) -> None:
    n = notifier(sock, WATCHDOG_USEC="30000000")
    assert n.ensure_watchdog(3.8) == 30.0
    n.ensure_watchdog(3.8)
    n.ready("reloaded")
    assert received(sock) == [{"READY": "1", "STATUS": "reloaded"}]


def test_no_watchdog_no_extension(sock: socket.socket) -> None:
    assert notifier(sock).ensure_watchdog(300) is None
    # WATCHDOG_PID names another process: the watchdog is not ours.
    assert notifier(sock, WATCHDOG_USEC="2000000", WATCHDOG_PID=str(os.getpid() + 1)).ensure_watchdog(300) is None
    assert received(sock) == []
    # Outside systemd: nothing to tell.
    assert Notifier({"WATCHDOG_USEC": "2000000"}).ensure_watchdog(300) == 2.0


def test_unreachable_socket_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock"), "WATCHDOG_USEC": "2000000"})
    with caplog.at_level(logging.WARNING, logger="lagwatch.serve.sdnotify"):
        assert n.ensure_watchdog(11.4) == 2.0
    assert "could not be told" in caplog.text
