"""A TCP relay on loopback between a replica's walreceiver and its primary that caps the
primary-to-replica bandwidth (a replica on a throughput-capped volume or link, as seen from
the WAL it gets), and can hold the stream entirely (TCP back-pressure, the session stays).

    with ThrottledLink(primary.host, primary.port) as link:
        replica.set_primary_conninfo(f"host={primary.host} port={link.port} ...")
        link.set_rate(6 * MB)   # bytes/s; None: unlimited; 0: held
"""

from __future__ import annotations

import socket
import threading
import time

from lagwatch.demo.ports import free_port

CHUNK = 16 * 1024


class ThrottledLink:
    def __init__(self, upstream_host: str, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.host = host
        self.port = free_port([host])
        self._rate: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.create_server((host, self.port))
        self._listener.settimeout(0.2)
        self._sockets: list[socket.socket] = []

    def set_rate(self, rate: float | None) -> None:
        with self._lock:
            self._rate = rate

    def _take(self, size: int) -> None:
        """Wait until ``size`` bytes may pass at the current rate."""
        while not self._stop.is_set():
            with self._lock:
                rate = self._rate
            if rate is None:
                return
            if rate > 0:
                time.sleep(size / rate)
                return
            time.sleep(0.05)  # held

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
