"""The HTTP server against odd and hostile clients, in-process with raw sockets: HEAD, the
auth scheme's case, headers on every response, no Python version in Server, one log line
per bad request, failed handshake or reset, deadlines and the connection cap."""

from __future__ import annotations

import base64
import json
import logging
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
import yaml
from lagwatch.cli import JsonFormatter
from lagwatch.config import parse_config
from lagwatch.config.web import load_web_config
from lagwatch.estimate.snapshot import SnapshotHolder
from lagwatch.serve.web import WebServer

PASSWORD_HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
HEADERS = {"X-Frame-Options": "deny", "Strict-Transport-Security": "max-age=60"}


def make_server(tmp_path: Path, *, tls: tuple[Path, Path] | None = None, auth: bool = True,
                http: dict[str, object] | None = None) -> WebServer:
    web: dict[str, object] = {"http_server_config": {"headers": HEADERS}}
    if auth:
        web["basic_auth_users"] = {"prometheus": PASSWORD_HASH}
    if tls is not None:
        web["tls_server_config"] = {"cert_file": str(tls[0]), "key_file": str(tls[1])}
    (tmp_path / "web.yml").write_text(yaml.safe_dump(web))
    clusters = [{"name": "m", "primary": {"dsn": "host=a"}}]
    config = parse_config({"clusters": clusters, **({"http": http} if http else {})},
                          web=load_web_config(tmp_path / "web.yml"))
    server = WebServer("127.0.0.1", 0, SnapshotHolder(), lambda: config)
    server.start()
    return server


@pytest.fixture
def plain(tmp_path: Path) -> Iterator[WebServer]:
    server = make_server(tmp_path, http={"request_timeout": "1s", "idle_timeout": "2s"})
    yield server
    server.stop()


def exchange(port: int, raw: bytes, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(raw)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def auth(scheme: str = "Basic") -> bytes:
    return f"Authorization: {scheme} {base64.b64encode(b'prometheus:s3cret').decode()}\r\n".encode()


def head_of(response: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = response.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def test_head_and_a_lowercase_scheme_are_answered(plain: WebServer) -> None:
    status, headers, body = head_of(exchange(plain.port, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n" + auth("basic")
                                             + b"Connection: close\r\n\r\n"))
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0, headers
    status, _, body = head_of(exchange(plain.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + auth("BASIC")
                                       + b"Connection: close\r\n\r\n"))
    assert status == 200 and body == b"starting\n"


@pytest.mark.parametrize(("raw", "expected"), [
    (b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", 401),  # then 405
    (b"DELETE / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 401),
    (b"POST /metrics HTTP/1.1\r\nHost: x\r\n" + auth() + b"Content-Length: 0\r\nConnection: close\r\n\r\n", 405),
    (b"GET /metrics HTTP/9.9\r\nHost: x\r\n" + auth() + b"Connection: close\r\n\r\n", 505),
    (b"GET /metrics HTTP/1.0\r\n" + auth() + b"\r\n", 200),
])
def test_who_asks_is_checked_before_what_is_asked_and_only_http_1_is_spoken(plain: WebServer, raw: bytes,
                                                                             expected: int) -> None:
    status, headers, _ = head_of(exchange(plain.port, raw))
    assert status == expected, headers
    if expected == 405:
        assert headers["allow"] == "GET, HEAD"


@pytest.mark.parametrize("raw", [
    b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",  # 401 before 404: auth first
    b"GET /nope HTTP/1.1\r\nHost: x\r\n" + auth() + b"Connection: close\r\n\r\n",  # 404
    b"POST /metrics HTTP/1.1\r\nHost: x\r\n" + auth() + b"Content-Length: 0\r\nConnection: close\r\n\r\n",  # 405
    b"GET /\x1b[2J\x00 HTTP/1.1\r\nHost: x\r\n\r\n",  # 400: control bytes in the request line
    b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",  # 431
    b"GET / HTTP/1.1\r\nHost: x\r\n",  # 408: the rest never comes
])
def test_every_response_carries_the_configured_headers_and_no_python_version(plain: WebServer,
                                                                             raw: bytes) -> None:
    status, headers, _ = head_of(exchange(plain.port, raw))
    assert status in (400, 401, 404, 405, 408, 431), status
    assert headers["server"] == "lagwatch", headers
    for name, value in HEADERS.items():
        assert headers[name.lower()] == value, (status, headers)


def test_control_bytes_reach_the_debug_log_escaped(plain: WebServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="lagwatch")
    exchange(plain.port, b"GET /%1b%5b HTTP/1.1\r\nHost: x\r\n" + auth() + b"Connection: close\r\n\r\n")
    exchange(plain.port, b"GET /\x1b[31m\r\nfake HTTP/1.1\r\n\r\n")
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "\x1b" not in text and all(r.getMessage().isprintable() for r in caplog.records), text


def test_a_silent_connection_is_closed_at_the_deadline_without_a_word(plain: WebServer) -> None:
    with socket.create_connection(("127.0.0.1", plain.port), timeout=5) as sock:
        # Connected, said nothing: the server closes it (request_timeout, 1 s) without a 408.
        # Had it not closed, this receive would time out and raise rather than read the end.
        assert sock.recv(4096) == b""


def test_a_slow_header_trickle_is_closed_at_the_deadline(plain: WebServer) -> None:
    with socket.create_connection(("127.0.0.1", plain.port), timeout=5) as sock:
        answer = b""
        for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\n":  # one byte per 0.1 s: never done in time
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            time.sleep(0.1)
            sock.setblocking(False)
            try:
                answer += sock.recv(4096)
            except BlockingIOError:
                pass
            sock.setblocking(True)
            if answer:
                break
        # The whole header would never come (no blank line): only the deadline answers it.
        assert answer.startswith(b"HTTP/1.1 408"), answer


def test_keep_alive_serves_several_requests_then_closes_when_idle(plain: WebServer) -> None:
    with socket.create_connection(("127.0.0.1", plain.port), timeout=5) as sock:
        for _ in range(3):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + auth() + b"\r\n")
            data = b""
            while not data.endswith(b"starting\n"):
                data += sock.recv(4096)
            assert data.startswith(b"HTTP/1.1 200")
        # idle_timeout (2 s) closes it; had it not, this receive would time out and raise.
        assert sock.recv(4096) == b""


def test_above_the_cap_the_oldest_waiting_connection_makes_room(tmp_path: Path) -> None:
    server = make_server(tmp_path, http={"max_connections": 5, "request_timeout": "30s"})
    try:
        idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(5)]
        time.sleep(0.3)
        # A scraper still gets in: the longest-waiting idle connection is closed for it.
        status, _, _ = head_of(exchange(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + auth()
                                        + b"Connection: close\r\n\r\n"))
        assert status == 200
        assert idle[0].recv(10) == b""
        assert server.http.closed["evicted"] == 1 and server.http.open_connections <= 5
        for sock in idle:
            sock.close()
    finally:
        server.stop()


def test_a_failed_handshake_or_a_reset_is_one_log_line(tmp_path: Path, pki_cert: tuple[Path, Path],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.INFO)
    server = make_server(tmp_path, tls=pki_cert)
    try:
        capsys.readouterr()
        exchange(server.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")  # plain HTTP to the TLS port
        with socket.create_connection(("127.0.0.1", server.port)) as sock:  # reset mid-handshake
            sock.sendall(b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        context = ssl.create_default_context()  # does not trust the certificate: fails on its side
        with pytest.raises(ssl.SSLError), socket.create_connection(("127.0.0.1", server.port)) as sock:
            context.wrap_socket(sock, server_hostname="localhost")
        deadline = time.monotonic() + 5
        lines: list[str] = []
        while time.monotonic() < deadline and sum("lagwatch.http" in line for line in lines) < 3:
            time.sleep(0.1)
            lines += capsys.readouterr().err.splitlines()
        assert "Traceback" not in "\n".join(lines)
        entries = [json.loads(line) for line in lines]  # every line is JSON
        entries = [e for e in entries if e["logger"] == "lagwatch.http"]
        assert len(entries) == 3, lines
        assert "plain HTTP to the TLS port" in entries[0]["msg"], entries
        assert all("TLS handshake failed" in e["msg"] or "connection lost" in e["msg"] for e in entries), entries
    finally:
        server.stop()
        root.removeHandler(handler)
        root.setLevel(old_level)


def test_basic_auth_over_plain_http_is_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="lagwatch")
    server = make_server(tmp_path)
    server.stop()
    assert any("basic auth without TLS" in r.getMessage() for r in caplog.records)


@pytest.fixture(scope="module")
def pki_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    import subprocess

    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "tls.crt", folder / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return cert, key


def test_a_large_answer_on_a_closing_connection_arrives_whole_to_a_slow_reader() -> None:
    """Connection: close (HTTP/1.0 clients, urllib) after a /metrics of megabytes: what was
    still buffered when the last write's wait returned (up to the low-water mark) was dropped
    by closing with abort(); a fleet bench's scrape arrived 31,933 bytes short of 3.9 MB.
    A small send buffer (as on a loaded machine or a slow link) makes it happen every time."""
    from lagwatch.serve.httpmessages import Response
    from lagwatch.serve.httpserver import HttpServer

    body = bytes(range(256)) * (1024 * 1024 // 256)
    server = HttpServer("127.0.0.1", 0, lambda request: Response(200, body))
    server._socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # accepted sockets inherit it
    server.start()
    try:
        for _ in range(3):
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
                sock.settimeout(10)
                sock.connect(("127.0.0.1", server.port))
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                time.sleep(0.2)  # the buffers fill: the server waits for the reader
                chunks = []
                while chunk := sock.recv(4096):
                    chunks.append(chunk)
            status, headers, received = head_of(b"".join(chunks))
            assert status == 200 and int(headers["content-length"]) == len(body)
            assert len(received) == len(body) and received == body
    finally:
        server.stop()


@pytest.mark.parametrize(("method", "size", "pieces"), [("GET", 100, 1), ("HEAD", 100, 1), ("GET", 1 << 20, 2)])
def test_an_answer_is_written_in_as_few_pieces_as_its_size_allows(method: str, size: int, pieces: int) -> None:
    """h11 gives a response's head a line at a time, and each piece written to an empty
    buffer is a send of its own: a syscall, and the GIL to take back from a busy cycle
    after it (six for a head, at up to the switch interval each). A small answer goes in one
    piece; a large body goes after the head as it is, not copied into one."""
    import h11
    from lagwatch.serve.httpmessages import Response, wire_pieces

    body = b"x" * size
    http = h11.Connection(h11.SERVER)
    http.receive_data(f"{method} /metrics HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert isinstance(http.next_event(), h11.Request) and http.next_event() == h11.EndOfMessage()
    headers = [("Content-Type", "text/plain"), ("Content-Length", str(size)), ("Server", "lagwatch")]
    written = wire_pieces(http, Response(200, body), headers, with_body=method != "HEAD")
    assert len(written) == pieces and all(written)
    status, head, received = head_of(b"".join(written))
    assert status == 200 and int(head["content-length"]) == size
    assert received == (b"" if method == "HEAD" else body)
    if pieces > 1:
        assert written[1] is body
