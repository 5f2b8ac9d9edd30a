"""`lagwatch demo` listens on lagwatch's usual port, or on a free one when that is taken."""

from __future__ import annotations

import contextlib
import socket

from lagwatch.demo import DEFAULT_LISTEN, demo_listen
from lagwatch.demo.ports import port_free


def test_taken_default_port_falls_back_to_a_free_one() -> None:
    with contextlib.ExitStack() as stack:
        holder = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        with contextlib.suppress(OSError):  # already taken by something else: just as good
            holder.bind(DEFAULT_LISTEN)
            holder.listen(1)
        host, port = demo_listen().rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) != DEFAULT_LISTEN[1]
        assert port_free(host, int(port))
