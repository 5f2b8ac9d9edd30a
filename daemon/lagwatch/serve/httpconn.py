"""Small chores of the HTTP server's connections (httpserver.py): a peer's name, why one
failed, refusing one at the cap, asyncio's errors as one line."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import socket
import ssl
import struct
import termios
from typing import Any

import h11

from lagwatch.errors import one_line

log = logging.getLogger("lagwatch.http")


def partial_request(http: h11.Connection) -> bool:
    """Whether a partial request is buffered (a slow client, not an idle one)."""
    return bool(getattr(http, "trailing_data", (b"", False))[0])


def refuse(sock: socket.socket) -> None:
    """Above the cap with every connection busy: say so at once and close (plain HTTP; a
    TLS client just sees the connection closed)."""
    with contextlib.suppress(OSError):
        sock.setblocking(False)
        sock.send(b"HTTP/1.1 503 Service Unavailable\r\nServer: lagwatch\r\nContent-Length: 0\r\n"
                  b"Connection: close\r\nRetry-After: 1\r\n\r\n")
    sock.close()


def peer_name(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        host = str(address[0])
        return f"[{host}]:{address[1]}" if ":" in host else f"{host}:{address[1]}"
    return str(address)


def reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        reason = exc.reason or exc.strerror or str(exc)
        if reason in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST"):
            return f"{reason} (plain HTTP to the TLS port?)"
        return one_line(str(reason))
    return one_line(exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__)


def one_line_exceptions(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """asyncio's default handler prints a traceback per failed connection; one line instead."""
    exc = context.get("exception")
    log.info("http: %s%s", context.get("message", "error"), f": {reason(exc)}" if exc else "")


def unacknowledged(fd: int) -> int:
    """Bytes sent on a TCP socket its peer has not acknowledged yet (Linux's SIOCOUTQ;
    0 where the ioctl is not there)."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0"))[0])
    except OSError:
        return 0
