"""Discovery at its edges: what a Patroni REST endpoint (or whatever answers in its place)
can do to the fetch, and how a membership change meets the running daemon (connections
that stay, a reload at the same moment, a rebuild that fails). The fetch is run against
real HTTP servers on loopback; the daemon tests poll nothing."""

from __future__ import annotations

import asyncio
import http.server
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lagwatch import runtime as runtime_module
from lagwatch.config import NodeConfig, PatroniDiscoveryConfig, parse_config
from lagwatch.daemon import Daemon
from lagwatch.errors import ConfigError
from lagwatch.read.conninfo import serves_as
from lagwatch.read.poll import NodePoller
from lagwatch.sources import discovery as discovery_module
from lagwatch.sources.patroni import DiscoveryError, Membership, cluster_config, fetch_membership, parse_cluster

MEMBERS = [{"name": n, "role": "leader" if n == "a" else "replica", "state": "running",
            "host": f"10.0.0.{i}", "port": 5432} for i, n in enumerate(("a", "b", "c"), 1)]
ANSWER = json.dumps({"members": MEMBERS}).encode()


class _Server:
    """An HTTP server on loopback whose every GET is answered by ``handle``; it records
    the requests' headers."""

    def __init__(self, handle: Callable[[http.server.BaseHTTPRequestHandler], None]) -> None:
        self.seen: list[dict[str, str]] = []
        seen = self.seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the stdlib names it so
                seen.append(dict(self.headers))
                handle(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[Any], None]], _Server]]:
    started: list[_Server] = []

    def start(handle: Callable[[Any], None]) -> _Server:
        started.append(_Server(handle))
        return started[-1]

    yield start
    for server in started:
        server.close()


def _answer(body: bytes, status: int = 200, headers: dict[str, str] | None = None) -> Callable[[Any], None]:
    def handle(h: Any) -> None:
        h.send_response(status)
        for key, value in (headers or {}).items():
            h.send_header(key, value)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
    return handle


def _discovery(*urls: str, **extra: Any) -> PatroniDiscoveryConfig:
    return PatroniDiscoveryConfig(kind="patroni", urls=urls, **extra)


def test_the_next_url_answers_when_the_first_fails(serve: Any) -> None:
    broken, good = serve(_answer(b"oops", 503)), serve(_answer(ANSWER))
    membership = fetch_membership(_discovery(broken.url, good.url, allowed_hosts=("10.0.0.0/24",)), 2.0)
    assert [m.name for m in membership.members] == ["a", "b", "c"] and membership.source == good.url


def test_a_redirect_is_not_followed_with_the_password(serve: Any, tmp_path: Path) -> None:
    elsewhere = serve(_answer(ANSWER))
    redirecting = serve(_answer(b"", 307, {"Location": elsewhere.url + "/cluster"}))
    password = tmp_path / "pw"
    password.write_text("s3cret\n")
    with pytest.raises(DiscoveryError, match="HTTP 307"):
        fetch_membership(_discovery(redirecting.url, username="lagwatch", password_file=password), 2.0)
    assert redirecting.seen[0]["Authorization"].startswith("Basic ")
    assert elsewhere.seen == []  # the credentials went nowhere else


def test_a_trickling_answer_is_cut_at_the_deadline(serve: Any) -> None:
    def trickle(h: Any) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "100000")
        h.end_headers()
        for _ in range(200):  # one byte every 50 ms: each receive is quick, the whole is not
            h.wfile.write(b" ")
            h.wfile.flush()
            time.sleep(0.05)

    slow = serve(trickle)
    # The answer never completes (100,000 bytes promised, 200 sent over 10 s): only the
    # 0.5 s deadline on the whole answer says "not complete in time".
    with pytest.raises(DiscoveryError, match="not complete in time"):
        fetch_membership(_discovery(slow.url), 0.5)


def test_nonsense_answers_are_discovery_errors(serve: Any, tmp_path: Path) -> None:
    deep = serve(_answer(b"[" * 60_000))  # past the JSON parser's recursion limit, within the size cap
    huge = serve(_answer(b" " * (1 << 21)))
    with pytest.raises(DiscoveryError) as caught:
        fetch_membership(_discovery(deep.url, huge.url), 2.0)
    assert "not JSON" in str(caught.value) and "larger than" in str(caught.value)

    # Not HTTP at all: a broken status line.
    listener = socket.create_server(("127.0.0.1", 0))

    def garbage() -> None:
        conn, _ = listener.accept()
        conn.recv(4096)
        conn.sendall(b"garbage\r\n\r\n")
        conn.close()

    threading.Thread(target=garbage, daemon=True).start()
    with pytest.raises(DiscoveryError, match="BadStatusLine"):
        fetch_membership(_discovery(f"http://127.0.0.1:{listener.getsockname()[1]}"), 2.0)
    listener.close()

    # A client certificate that is no certificate: the TLS set-up fails, and says so.
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    with pytest.raises(DiscoveryError, match="TLS set-up failed"):
        fetch_membership(_discovery("https://127.0.0.1:1", cert_file=bad, key_file=bad), 2.0)


@pytest.mark.parametrize(("url", "problem"), [
    ("http://x:99999", "the port is not a number from 1 to 65535"),
    ("http://x:0", "the port is not a number from 1 to 65535"),
    ("http://x:port", "the port is not a number from 1 to 65535"),
    ("http://x:8008/patroni", "scheme, host and port only"),
    ("http://x:8008?a=b", "scheme, host and port only"),
])
def test_urls_are_checked_when_loaded(url: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"clusters": [{"name": "m", "discovery": {"kind": "patroni", "urls": [url]},
                                    "members": {"dsn": "user=x"}}]})
    assert any(problem in p and "clusters[0].discovery.urls" in p for p in caught.value.problems)


# -- the writer's host list ---------------------------------------------------------------

def _node(dsn: str) -> NodeConfig:
    return NodeConfig(dsn=dsn)


@pytest.mark.parametrize(("old", "new", "connected", "kept"), [
    ("host=a,b port=1,2 user=x", "host=a,b port=1,2 user=x", None, True),  # unchanged
    ("host=a,b port=1,2 user=x", "host=a,b,c port=1,2,3 user=x", ("a", 1), True),  # c joined
    ("host=a,b port=1,2 user=x", "host=b port=2 user=x", ("a", 1), False),  # the one it is on left
    ("host=a,b port=1,2 user=x", "host=a,c port=1,3 user=x", ("a", 1), True),  # b left, c joined
    ("host=a,b port=1,2 user=x", "host=a,c port=1,3 user=y", ("a", 1), False),  # another user
    ("host=a,b port=5432 user=x", "host=a,b,c port=5432 user=x", ("b", 5432), True),  # one port for all
    ("host=a,b port=1,2 user=x", "host=a,b,c port=1,2,3 user=x", None, False),  # not connected: nothing to keep
])
def test_a_session_serves_a_writer_whose_list_still_holds_its_server(
        old: str, new: str, connected: tuple[str, int] | None, kept: bool) -> None:
    assert serves_as(_node(old), _node(new), connected) is kept


# -- HAProxy with members that come and go ------------------------------------------------

HAPROXY = {"kind": "haproxy", "socket": "/run/haproxy.sock", "backend": "reads",
           "servers": {"a": "pg_a", "b": "pg_b", "c": "pg_c"}}


def test_haproxy_servers_of_members_not_there_now_are_fine() -> None:
    (cluster,) = parse_config({"clusters": [{"name": "m", "discovery": {"kind": "patroni", "urls": ["http://x:1"]},
                                             "members": {"dsn": "user=x"}, "pooler": HAPROXY}]}).patroni_clusters
    two = parse_cluster({"members": MEMBERS[:2]}, "u")  # c left: its server is ejected, not an error
    assert [r.name for r in cluster_config(cluster, two).replicas] == ["a", "b"]
    with pytest.raises(ConfigError) as caught:
        parse_config({"clusters": [{"name": "m", "discovery": {"kind": "patroni", "urls": ["http://x:1"]},
                                    "members": {"dsn": "user=x"},
                                    "pooler": {**HAPROXY, "servers": {"primary": "pg_a"}}}]})
    assert any("'primary' is none of them" in p for p in caught.value.problems)


# -- membership changes meet the daemon ---------------------------------------------------

def _daemon(monkeypatch: pytest.MonkeyPatch, answers: list[list[dict[str, Any]]], tmp_path: Path) -> Daemon:
    def fetch(config: Any, timeout: float) -> Membership:
        return parse_cluster({"members": answers[0]}, config.urls[0])

    monkeypatch.setattr(discovery_module, "fetch_membership", fetch)
    path = tmp_path / "lagwatch.yaml"
    path.write_text(yaml.safe_dump({"interval": "1s", "clusters": [
        {"name": "m", "discovery": {"kind": "patroni", "urls": ["http://x:1"]}, "members": {"dsn": "user=x"}}]}))
    from lagwatch.config import load_config
    return Daemon(load_config(path), config_path=path)


def test_members_that_stay_keep_their_pollers_and_the_writer_keeps_its_session(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    answers = [MEMBERS]
    daemon = _daemon(monkeypatch, answers, tmp_path)
    hooks: list[str] = []
    daemon.reload_hooks.append(lambda config: lambda: hooks.append("applied"))

    async def scenario() -> None:
        await daemon.discover_now()
        before = {p.node: p for p in daemon.runtime.pollers["m"]}
        assert set(before) == {"primary", "a", "b", "c"}
        # The writer's session is on a (the leader); c leaves, d joins.
        monkeypatch.setattr(before["primary"], "connected_address", lambda: ("10.0.0.1", 5432))
        answers[0] = [*MEMBERS[:2], {"name": "d", "role": "replica", "host": "10.0.0.4", "port": 5432}]
        await daemon.discover_now()
        after = {p.node: p for p in daemon.runtime.pollers["m"]}
        assert set(after) == {"primary", "a", "b", "d"}
        assert after["a"] is before["a"] and after["b"] is before["b"]
        assert after["primary"] is before["primary"]  # kept, and pointed at the new list
        assert "10.0.0.4" in after["primary"].node_config.dsn and "10.0.0.3" not in after["primary"].node_config.dsn
        assert after["a"].cluster is daemon.config.clusters_with_nodes[0]
        await daemon.close()

    asyncio.run(scenario())
    assert hooks == []  # a membership change is no reload: the web config is not re-read


def test_a_rebuild_that_fails_is_tried_again_next_cycle(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    answers = [MEMBERS]
    daemon = _daemon(monkeypatch, answers, tmp_path)
    real = runtime_module.pollers_for
    failures = [RuntimeError("cannot build")]

    def flaky(cluster: Any, config: Any, context: Any) -> list[NodePoller]:
        if failures:
            raise failures.pop()
        return real(cluster, config, context)

    monkeypatch.setattr(runtime_module, "pollers_for", flaky)

    async def scenario() -> None:
        await daemon.discover_now()  # the members are stored, but not put in force
        assert daemon.config.clusters_with_nodes == ()
        await daemon.discover_now()  # the next answer: no change since, and what failed is tried again
        assert [r.name for r in daemon.config.clusters_with_nodes[0].replicas] == ["a", "b", "c"]
        await daemon.close()

    asyncio.run(scenario())


def test_a_reload_during_a_membership_change_keeps_the_new_members(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    answers = [MEMBERS]
    daemon = _daemon(monkeypatch, answers, tmp_path)

    async def scenario() -> None:
        await daemon.discover_now()
        async with daemon.lock:  # a cycle is running: it will take a membership change
            reload = asyncio.ensure_future(daemon.reload())
            await asyncio.sleep(0.05)  # the reload has read the file and waits for the cycle
            answers[0] = MEMBERS[:2]
            assert await daemon.sources.ask_now(1.0)
            await daemon.put_sources_in_force()
        assert await reload
        assert [r.name for r in daemon.config.clusters_with_nodes[0].replicas] == ["a", "b"]
        await daemon.close()

    asyncio.run(scenario())
