"""A real `lagwatch run` against hostile neighbours on its HTTP port: 1,100 slow clients
against a daemon limited to 1,024 descriptors, and 500 eager scrapers for 20 s."""

from __future__ import annotations

import asyncio
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
from lagwatch.localcluster import free_port

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


def test_1100_slow_clients_do_not_starve_a_scraper(pg_cluster: ChaosCluster, tmp_path: Path,
                                                   many_descriptors: None) -> None:
    config = cluster_config(pg_cluster, free_port(["127.0.0.1"]))
    config["http"] = {"request_timeout": f"{REQUEST_TIMEOUT:g}s"}
    lw = Lagwatch(tmp_path, config, max_descriptors=1024)
    try:
        lw.wait_ready()
        scrapes: list[tuple[int, float] | str] = []
        stop = threading.Event()

        def scraper() -> None:
            while not stop.is_set():
                try:
                    scrapes.append(scrape(lw.port, timeout=1.0))
                except (OSError, http.client.HTTPException, AssertionError) as exc:
                    scrapes.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.1)

        thread = threading.Thread(target=scraper)
        thread.start()
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
            stop.set()
            thread.join()
            for sock in slow:
                sock.close()
        failed = [s for s in scrapes if isinstance(s, str) or s[0] != 200 or s[1] >= 1.0]
        assert len(scrapes) >= 10 and not failed, (len(scrapes), failed[:5])
        time.sleep(1.5)  # the HTTP figures are rendered with each cycle's snapshot
        closed = {dict(labels)["reason"]: value for (name, labels), value in lw.samples().items()
                  if name == "lagwatch_http_connections_closed_total"}
        assert closed["deadline"] + closed["evicted"] >= 1000, closed
        assert lw.daemon_value("lagwatch_http_connection_cap") == 512
        assert "Traceback" not in lw.log_text()
    finally:
        lw.stop()


def test_500_eager_scrapers_see_no_connect_stall_and_flat_memory(pg_cluster: ChaosCluster, tmp_path: Path,
                                                                  many_descriptors: None) -> None:
    lw = Lagwatch.for_cluster(tmp_path, pg_cluster)
    try:
        lw.wait_ready()
        connects: list[float] = []
        failures: list[str] = []
        rss: list[float] = []

        async def scraper(until: float) -> None:
            loop = asyncio.get_running_loop()
            while loop.time() < until:
                started = loop.time()
                try:
                    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", lw.port), 10)
                except (OSError, TimeoutError) as exc:
                    failures.append(f"connect: {exc!r}")
                    continue
                connects.append(loop.time() - started)
                writer.write(b"GET /metrics HTTP/1.1\r\nHost: lagwatch\r\nConnection: close\r\n\r\n")
                try:
                    data = await asyncio.wait_for(reader.read(), 10)
                    if not data.startswith(b"HTTP/1.1 200"):
                        failures.append(data[:60].decode(errors="replace"))
                except (OSError, TimeoutError) as exc:
                    failures.append(f"read: {exc!r}")
                finally:
                    writer.close()

        async def sample_memory(until: float) -> None:
            loop = asyncio.get_running_loop()
            while loop.time() < until:
                rss.append(rss_mb(lw.proc.pid))
                await asyncio.sleep(1)

        async def main() -> None:
            until = asyncio.get_running_loop().time() + 20
            await asyncio.gather(sample_memory(until), *(scraper(until) for _ in range(500)))

        asyncio.run(main())
        assert not failures, failures[:5]
        assert len(connects) >= 1000, len(connects)
        assert max(connects) < 1.0, sorted(connects)[-5:]
        # Flat: what it holds after the first seconds of the flood is what it holds at the end.
        assert rss[-1] - rss[4] < 15, rss
        print(f"500 scrapers: {len(connects)} scrapes in 20 s, slowest connect {max(connects) * 1000:.0f} ms, "
              f"RSS {rss[0]:.0f} -> {rss[4]:.0f} -> {rss[-1]:.0f} MB")
        assert lw.value("lagwatch_up", node="replica1") == 1  # polling went on
    finally:
        lw.stop()
