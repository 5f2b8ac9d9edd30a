"""Free TCP ports on loopback addresses, for the demo's servers and the tests'."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import stat
import tempfile
import time
from collections.abc import Collection, Sequence
from pathlib import Path

# A port is free from its pick until the server it is for binds it (a second or so for
# PostgreSQL), and two processes picking at once (two demos, or the test suite's two
# streams of servers) can both be handed it by the kernel. So each pick is noted, for
# HOLD seconds, in a file this user's processes share under an exclusive lock, and a port
# noted there is not handed out again meanwhile. Hand-written: portpicker's answer to this
# is a port server daemon, more than a note in a file needs.
HOLD = 120.0


def _notes() -> Path:
    return Path(tempfile.gettempdir()) / f"lagwatch-ports-{os.geteuid()}"


def claim(port: int, now: float, notes: Path) -> bool:
    """Note ``port`` as handed out at ``now`` (seconds) in ``notes``; False when another
    pick noted it less than HOLD seconds before. Where the notes cannot be used (not a
    plain file of this user's, locked past LOCK_WAIT, unreadable, a failed write), the pick
    stands alone, as it did before notes were kept."""
    try:
        fd = os.open(notes, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError:
        return True
    try:
        with os.fdopen(fd, "r+", encoding="ascii", errors="replace") as f:
            st = os.fstat(fd)
            # Another user's file (made first under a shared temp dir), a FIFO, a hard link.
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
                return True
            if not _lock(fd):
                return True
            held: dict[int, float] = {}
            for line in f:
                with contextlib.suppress(ValueError):
                    noted_port, at = line.split()
                    if 0 <= now - float(at) < HOLD:
                        held[int(noted_port)] = float(at)
            if port in held:
                return False
            held[port] = now
            f.seek(0)
            f.truncate()
            f.write("".join(f"{p} {at!r}\n" for p, at in held.items()))
    except OSError:  # a failed write (closing flushes it): the notes are lost, the pick stands
        return True
    return True


LOCK_WAIT = 2.0  # seconds a pick waits for the notes' lock before it goes without


def _lock(fd: int) -> bool:
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)


def port_free(host: str, port: int) -> bool:
    # No SO_REUSEADDR: also rejects ports held by a wildcard listener or in TIME_WAIT.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(hosts: Sequence[str], *, exclude: Collection[int] = ()) -> int:
    """A TCP port currently free on all the given loopback addresses, and not handed out by
    another pick on this host in the last HOLD seconds."""
    if not hosts:
        raise ValueError("free_port needs at least one host")
    for _ in range(500):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((hosts[0], 0))
            port: int = s.getsockname()[1]
        if port not in exclude and all(port_free(h, port) for h in hosts) and claim(port, time.time(), _notes()):
            return port
    raise RuntimeError(f"no TCP port free on all of {list(hosts)}")
