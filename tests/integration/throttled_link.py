"""A TCP relay on loopback between a replica's walreceiver and its primary that caps the
primary-to-replica bandwidth (a replica on a throughput-capped volume or link, as seen from
the WAL it gets), and can hold the stream entirely (TCP back-pressure, the session stays).

    with ThrottledLink(primary.host, primary.port) as link:
        replica.set_primary_conninfo(f"host={primary.host} port={link.port} ...")
        link.set_rate(6 * MB)   # bytes/s; None: unlimited; 0: held

The cap is kept on an absolute schedule (each chunk is due when the bytes before it would
have passed at the rate): a relay thread that a busy host wakes late sends the chunks it
owes at once instead of losing that time, so the rate over any second or more is the one
set as long as the relay gets the CPU it needs at all. (Sleeping ``size / rate`` after each
chunk, as it once did, lost every late wake-up: on a loaded 2-core host 6 MB/s came out as
4.0-4.9 MB/s.) What may be made up is bounded (``CATCH_UP``): time the stream was idle or
held is not saved up for a burst.
"""

from __future__ import annotations

import socket
import threading
import time

from lagwatch.demo.ports import free_port

CHUNK = 64 * 1024
# Seconds of lateness the schedule may make up at once (bytes: this times the rate). More
# than a busy host's longest stall of one thread; less than would read as a burst.
CATCH_UP = 0.5


class ThrottledLink:
    def __init__(self, upstream_host: str, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.host = host
        self.port = free_port([host])
        self._rate: float | None = None
        self._due = 0.0  # when the next byte may pass (monotonic), at the current rate
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.create_server((host, self.port))
        self._listener.settimeout(0.2)
        self._sockets: list[socket.socket] = []

    def set_rate(self, rate: float | None) -> None:
        with self._lock:
            self._rate = rate
            self._due = time.monotonic()  # a new rate: nothing owed from the old one

    def _take(self, size: int) -> None:
        """Wait until ``size`` bytes may pass at the current rate."""
        while not self._stop.is_set():
            with self._lock:
                rate = self._rate
                if rate is None:
                    return
                if rate > 0:
                    now = time.monotonic()
                    start = max(self._due, now - CATCH_UP)
                    self._due = start + size / rate
                    wait = start - now  # this chunk's bytes start passing at ``start``
                    break
            time.sleep(0.05)  # held
        else:
            return
        if wait > 0:
            time.sleep(wait)

    def _pump(self, source: socket.socket, sink: socket.socket, throttled: bool) -> None:
        try:
            while not self._stop.is_set():
                data = source.recv(CHUNK)
                if not data:
                    break
                if throttled:
                    self._take(len(data))
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()

    def __enter__(self) -> ThrottledLink:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._listener.close()
        for s in self._sockets:
            try:
                s.close()
            except OSError:
                pass
