"""What the HTTP server (httpserver.py) hands its handler, what the handler gives back, and
the pieces that answer is written in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import h11

# An answer's body this small is written with its head in one piece.
SMALL_BODY_BYTES = 64 * 1024


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: dict[str, str]  # lower-case names
    peer: str
    tls_peer_cert: dict[str, Any] | None = None

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Response]


def wire_pieces(http: h11.Connection, response: Response, headers: list[tuple[str, str]],
                with_body: bool = True) -> list[bytes]:
    """``response`` as the pieces to write, each non-empty, in as few as its size allows:
    h11 gives the head a line at a time, and each piece written to an empty buffer is a
    send of its own (a syscall, and the GIL to take back from a busy cycle after it), so
    the head is one piece, and a small body goes with it; a large body is handed on as it
    is (a fleet's /metrics is megabytes: a join is one more copy of it). ``with_body``
    False for HEAD. Raises h11.LocalProtocolError for what h11 refuses to send."""
    head = http.send(h11.Response(status_code=response.status, headers=headers)) or b""
    body = list(http.send_with_data_passthrough(h11.Data(data=response.body)) or ()) if with_body else []
    tail = http.send(h11.EndOfMessage()) or b""
    if sum(map(len, body)) <= SMALL_BODY_BYTES:
        return [b"".join([head, *body, tail])]
    return [piece for piece in (head, *body, tail) if piece]
