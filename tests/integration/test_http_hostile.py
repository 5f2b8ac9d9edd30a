"""A real `lagwatch run` against hostile neighbours on its HTTP port: 1,100 slow clients
against a daemon limited to 1,024 descriptors. (The flood of 500 eager scrapers, a speed and
memory figure, is bench/scrapers.py.)"""

from __future__ import annotations

import http.client
import resource
import select
import socket
import threading
import time
from pathlib import Path

import pytest
from chaoscluster import ChaosCluster
from harness import Lagwatch, cluster_config
from lagwatch.demo.ports import free_port

pytestmark = pytest.mark.one_pg_version

REQUEST_TIMEOUT = 3.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def many_descriptors() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def scrape(port: int, timeout: float) -> tuple[int, float]:
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        body = response.read()
        assert b"lagwatch_up" in body
        return response.status, time.monotonic() - started
    finally:
        conn.close()


class Scrapes:
    """Fresh scrapes from a thread, one every ``every`` seconds from ``start`` to
    ``stop``: ``done`` holds each one's (status, seconds), or what went wrong."""

    def __init__(self, port: int, timeout: float, every: float) -> None:
        self.port, self.timeout, self.every = port, timeout, every
        self.done: list[tuple[int, float] | str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.done.append(scrape(self.port, timeout=self.timeout))
            except (OSError, http.client.HTTPException, AssertionError) as exc:
                self.done.append(f"{type(exc).__name__}: {exc}")
            time.sleep(self.every)

    def start(self) -> Scrapes:
        self._thread.start()
        return self

    def stop(self) -> list[tuple[int, float] | str]:
        self._stop.set()
        self._thread.join()
        return self.done


def test_1100_slow_clients_do_not_starve_a_scraper(pg_cluster: ChaosCluster, tmp_path: Path,
                                                   many_descriptors: None) -> None:
    config = cluster_config(pg_cluster, free_port(["127.0.0.1"]))
    config["http"] = {"request_timeout": f"{REQUEST_TIMEOUT:g}s"}
    with Lagwatch(tmp_path, config, max_descriptors=1024) as lw:
        lw.wait_ready()
        scraper = Scrapes(lw.port, timeout=1.0, every=0.1).start()

        slow: dict[socket.socket, float] = {}
        try:
            for _ in range(1100):  # each says half a request and then nothing (slowloris)
                sock = socket.create_connection(("127.0.0.1", lw.port), timeout=5)
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: lagwatch\r\n")
                slow[sock] = time.monotonic()
            # Every slow connection is closed by the server within the deadline (or sooner,
            # evicted to make room), with a 408 at most.
            lived: list[float] = []
            open_socks = set(slow)
            poller = select.poll()
            by_fd = {sock.fileno(): sock for sock in slow}
            for fd in by_fd:
                poller.register(fd, select.POLLIN)
            until = time.monotonic() + REQUEST_TIMEOUT + 10
            while open_socks and time.monotonic() < until:
                for fd, _ in poller.poll(500):
                    sock = by_fd[fd]
                    if sock not in open_socks:
                        continue
                    try:
                        data = sock.recv(4096)
                    except ConnectionResetError:
                        data = b""
                    if not data:
                        lived.append(time.monotonic() - slow[sock])
                        open_socks.discard(sock)
                        poller.unregister(fd)
                    else:
                        assert data.startswith(b"HTTP/1.1 408"), data[:100]
            assert not open_socks, f"{len(open_socks)} slow connections still open"
            assert max(lived) < REQUEST_TIMEOUT + 2.0, max(lived)
        finally:
            scrapes = scraper.stop()
            for sock in slow:
                sock.close()
        failed = [s for s in scrapes if isinstance(s, str) or s[0] != 200 or s[1] >= 1.0]
        assert len(scrapes) >= 10 and not failed, (len(scrapes), failed[:5])
        lw.wait_cycles(2)  # the HTTP figures are rendered with each cycle's snapshot
        closed = {dict(labels)["reason"]: value for (name, labels), value in lw.samples().items()
                  if name == "lagwatch_http_connections_closed_total"}
        assert closed["deadline"] + closed["evicted"] >= 1000, closed
        assert lw.daemon_value("lagwatch_http_connection_cap") == 512
        assert "Traceback" not in lw.log_text()


def test_600_pipelining_clients_that_never_read_do_not_hold_the_slots(pg_cluster: ChaosCluster, tmp_path: Path,
                                                                      many_descriptors: None) -> None:
    """600 clients each send 20 `GET /metrics` at once and never read an answer. The server
    answers what the client's buffers take, then closes each connection whose client has
    not read its answers within the write deadline (the slow-reader count), so fresh
    scrapes keep answering (median within 1 s) while they try."""
    config = cluster_config(pg_cluster, free_port(["127.0.0.1"]))
    config["http"] = {"request_timeout": f"{REQUEST_TIMEOUT:g}s"}
    request = b"GET /metrics HTTP/1.1\r\nHost: lagwatch\r\n\r\n" * 20
    with Lagwatch(tmp_path, config, max_descriptors=1024) as lw:
        lw.wait_ready()
        scraper = Scrapes(lw.port, timeout=5.0, every=0.2).start()

        socks: list[socket.socket] = []
        try:
            for _ in range(600):
                sock = socket.create_connection(("127.0.0.1", lw.port), timeout=5)
                sock.sendall(request)
                socks.append(sock)
            time.sleep(REQUEST_TIMEOUT + 3)  # the write deadline, and then some: the time under attack
        finally:
            scrapes = scraper.stop()
            for sock in socks:
                sock.close()
        times = sorted(s[1] for s in scrapes if not isinstance(s, str) and s[0] == 200)
        failed = [s for s in scrapes if isinstance(s, str) or s[0] != 200]
        print(f"{len(scrapes)} scrapes, {len(failed)} failed; median {times[len(times) // 2] if times else None}")
        assert len(scrapes) >= 10 and len(times) >= 0.9 * len(scrapes), (len(scrapes), failed[:5])
        assert times[len(times) // 2] < 1.0, times
        lw.wait_cycles(2)  # the HTTP figures are rendered with each cycle's snapshot
        closed = {dict(labels)["reason"]: value for (name, labels), value in lw.samples().items()
                  if name == "lagwatch_http_connections_closed_total"}
        assert closed.get("slow_reader", 0) >= 100, closed
        assert "Traceback" not in lw.log_text()
