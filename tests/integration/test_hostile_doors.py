"""Hostile input, round two: what Patroni's REST API, a ``clusters_dir`` and a refused
reload let in, against a real `lagwatch run`.

Patroni here is a fake that speaks HTTPS only and wants a client certificate signed by the
test's CA (as a hardened Patroni does); its answer is whatever the test sets. No
PostgreSQL is needed: the members it names are loopback ports nobody listens on, polled
and down, which is all these doors need.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Lagwatch
from lagwatch.demo.ports import free_port
from patroni_cluster import RestTls

pytestmark = pytest.mark.one_pg_version  # nothing here runs PostgreSQL


class FakePatroni:
    """``GET /cluster`` over HTTPS, client certificate required; ``answer`` is served."""

    def __init__(self, tls: RestTls) -> None:
        self.answer = b"{}"
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the stdlib names it so
                body = server.answer
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*map(str, tls.server))
        context.load_verify_locations(cafile=str(tls.ca))
        context.verify_mode = ssl.CERT_REQUIRED
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def serve(self, members: list[dict[str, Any]]) -> None:
        self.answer = json.dumps({"members": members}).encode()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def members(names: list[str]) -> list[dict[str, Any]]:
    """Members on loopback ports nobody listens on (the first leads)."""
    return [{"name": name, "role": "leader" if i == 0 else "replica", "state": "running", "host": "127.0.0.1",
             "port": 1 + i % 1000} for i, name in enumerate(names)]


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> RestTls:
    return RestTls(tmp_path_factory.mktemp("tls") / "pki", ["127.0.0.1"])


@pytest.fixture
def patroni(tls: RestTls) -> Iterator[FakePatroni]:
    fake = FakePatroni(tls)
    fake.serve(members(["a", "b", "c"]))
    yield fake
    fake.close()


def discovered(patroni: FakePatroni, tls: RestTls, **extra: Any) -> dict[str, Any]:
    return {"listen": f"127.0.0.1:{free_port(['127.0.0.1'])}", "interval": "200ms", "clusters": [
        {"name": "main", "discovery": {"kind": "patroni", "urls": [patroni.url], "ca_file": str(tls.ca),
                                       "cert_file": str(tls.client[0]), "key_file": str(tls.client[1]), **extra},
         "members": {"dsn": "user=lagwatch dbname=postgres connect_timeout=1"}}]}


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_an_answer_of_4000_members_is_refused_and_costs_nothing_once_it_is_gone(
        patroni: FakePatroni, tls: RestTls, tmp_path: Path) -> None:
    with Lagwatch(tmp_path, discovered(patroni, tls)) as lw:
        lw.wait_ready()
        lw.wait_for("3 members", lambda: lw.value("lagwatch_discovery_members", cluster="main") == 3, timeout=20)
        lw.wait_cycles(10)
        pid = lw.proc.pid
        rss, fds = _rss_kib(pid), _descriptors(pid)
        patroni.serve(members([f"m{i:04d}" for i in range(4000)]))
        lw.wait_for("discovery down", lambda: lw.value("lagwatch_discovery_up", cluster="main") == 0, timeout=20)
        lw.wait_cycles(10)  # ten cycles of the hostile answer
        assert lw.value("lagwatch_discovery_members", cluster="main") == 3  # the last good ones kept
        log = lw.log_text()
        # Refused by its size, unparsed (a member is allowed 2 kB): one WARNING.
        assert log.count("more than max_members (32) members take: refused") == 1, log[-3000:]
        assert "m0001" not in log  # not one of them polled or named
        patroni.serve(members(["a", "b", "c"]))
        lw.wait_for("discovery up", lambda: lw.value("lagwatch_discovery_up", cluster="main") == 1, timeout=20)
        lw.wait_cycles(10)
        assert lw.value("lagwatch_discovery_members", cluster="main") == 3
        after_rss, after_fds = _rss_kib(pid), _descriptors(pid)
    print(f"RSS {rss} -> {after_rss} KiB, descriptors {fds} -> {after_fds}")
    assert after_rss <= rss * 1.10 and after_fds <= fds * 1.10 + 1, (rss, after_rss, fds, after_fds)


def test_member_names_with_newlines_and_escapes_are_refused_in_one_escaped_line(
        patroni: FakePatroni, tls: RestTls, tmp_path: Path) -> None:
    """A member name holding a newline (a forged log line after it) or an escape sequence
    is no node name (round three: one rule for node names, config/base.NODE_NAME): the
    answer is refused, and the refusal names it in one escaped line."""
    forged = "b\n2026-11-26 00:00:00,000 ERROR lagwatch.forged: <script>alert(1)</script>"
    patroni.serve(members(["a", forged, "c\x1b[31mred"]))
    with Lagwatch(tmp_path, discovered(patroni, tls)) as lw:
        lw.wait_ready()
        lw.wait_logged("member discovery failed")
        lw.wait_cycles(3)
        assert lw.value("lagwatch_discovery_up", cluster="main") == 0
        log = lw.log_text()
    assert "\x1b" not in log
    assert not any(line.startswith("2026-11-26 00:00:00,000") for line in log.splitlines()), log[-2000:]
    (refused,) = [line for line in log.splitlines() if "member discovery failed" in line]
    assert "a member has no usable name ('b\\n2026-11-26 00:00:00,000 ERRO" in refused, refused


def test_a_patroni_url_with_a_password_is_refused_without_repeating_it(
        patroni: FakePatroni, tls: RestTls, tmp_path: Path) -> None:
    with Lagwatch(tmp_path, discovered(patroni, tls)) as lw:
        lw.wait_ready()
        lw.wait_for("3 members", lambda: lw.value("lagwatch_discovery_members", cluster="main") == 3, timeout=20)
        bad = discovered(patroni, tls)
        bad["listen"] = f"127.0.0.1:{lw.port}"
        bad["clusters"][0]["discovery"]["urls"] = ["https://lagwatch:UrlSecret-41@127.0.0.1:47360"]
        lw.write_config(bad)
        lw.signal(signal.SIGHUP)
        lw.wait_logged("clusters[0].discovery.urls")
        lw.wait_cycles(2)  # the old config runs on
        assert lw.value("lagwatch_discovery_members", cluster="main") == 3
        log = lw.log_text()
    assert "UrlSecret-41" not in log
    assert "https://***@127.0.0.1:47360" in log  # the user part may be a token too: none of it shown


def _churn(lw: Lagwatch, patroni: FakePatroni, phase: str, rounds: int) -> None:
    """``rounds`` answers of 32 members each, every name new (60 characters), each answer
    waited on until lagwatch has polled its first member."""
    for round_ in range(rounds):
        names = [f"{phase}{round_:02d}-{i:02d}-".ljust(60, "x") for i in range(32)]
        patroni.serve(members(names))
        lw.wait_for(f"{names[0]} polled", lambda first=names[0]: any(
            dict(labels).get("node") == first for name, labels in lw.samples() if name == "lagwatch_up"), 20)


def test_member_churn_leaves_only_the_members_series(patroni: FakePatroni, tls: RestTls, tmp_path: Path) -> None:
    """Churn under the member cap (32 new 60-character names per answer, 10 answers), then
    the same three members back: /metrics holds the three's
    series only, as before the churn (the code before the memory mend passed this too: it
    dropped the series, not the state). What the tracker keeps of departed members is
    measured where it is deterministic, in test_export_and_tracker (tracemalloc: 2.7 KB
    over 320 departed names, 384 KB before); RSS, which the allocator blurs, is printed."""
    with Lagwatch(tmp_path, discovered(patroni, tls)) as lw:
        lw.wait_ready()
        lw.wait_for("3 members", lambda: lw.value("lagwatch_discovery_members", cluster="main") == 3, timeout=20)
        lw.wait_cycles(3)
        pid = lw.proc.pid
        metrics_before, rss = len(lw.get("/metrics")[1]), [_rss_kib(pid)]
        _churn(lw, patroni, "a", 10)
        patroni.serve(members(["a", "b", "c"]))
        lw.wait_for("the churned members gone", lambda: not any(
            dict(labels).get("node", "").endswith("xxx") for _, labels in lw.samples()), 20)
        lw.wait_cycles(3)
        rss.append(_rss_kib(pid))
        metrics_after = len(lw.get("/metrics")[1])
        nodes = {dict(labels).get("node") for _, labels in lw.samples()} - {None}
    print(f"/metrics {metrics_before} -> {metrics_after} bytes; RSS {' -> '.join(map(str, rss))} KiB")
    assert nodes <= {"a", "b", "c", "primary"}, nodes
    assert metrics_after <= metrics_before * 1.05, (metrics_before, metrics_after)
