"""Fixtures the unit tests share."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def sock(tmp_path: Path) -> Iterator[socket.socket]:
    """sd_notify's datagram socket: what lagwatch says to systemd, read as systemd would
    (test_sdnotify.py, test_reload.py)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(tmp_path / "notify.sock"))
    s.setblocking(False)
    yield s
    s.close()

