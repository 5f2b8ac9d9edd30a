"""HTTP endpoints: /metrics, /status, /healthz, /readyz, /api/status. Reads snapshots only.

With a web config (exporter-toolkit format) every endpoint is served over TLS and/or
behind basic auth.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from lagwatch import status_page
from lagwatch.daemon import SnapshotHolder
from lagwatch.export import SnapshotCollector
from lagwatch.status import snapshot_status
from lagwatch.webconfig import BasicAuth, WebConfig, ssl_context

log = logging.getLogger("lagwatch.web")


class WebServer:
    """A small threaded HTTP server; every response is rendered from the last snapshot."""

    def __init__(self, host: str, port: int, holder: SnapshotHolder, interval: Callable[[], float],
                 web_config: WebConfig | None = None) -> None:
        self.holder = holder
        self.interval = interval
        self.web_config = web_config or WebConfig()
        self.auth = BasicAuth(self.web_config.basic_auth_users)
        self.extra_headers = (self.web_config.http_server_config.headers
                              if self.web_config.http_server_config else {})
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(holder.get))
        handler = _make_handler(self)
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        context = ssl_context(self.web_config)
        if context is not None:
            # The handshake happens in the request's own thread (on first read), so a
            # client that connects and says nothing cannot block the accept loop.
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True,
                                                    do_handshake_on_connect=False)
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="lagwatch-http", daemon=True)
        self._rendered: tuple[object, str, bytes] | None = None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def metrics(self, accept: str) -> tuple[bytes, str]:
        """The exposition of the current snapshot, rendered once per snapshot and format:
        scrapes between two cycles are served from memory."""
        encoder, content_type = choose_encoder(accept)
        snapshot = self.holder.get()
        cached = self._rendered
        if cached is not None and cached[0] is snapshot and cached[1] == content_type:
            return cached[2], content_type
        body = encoder(self.registry)
        self._rendered = (snapshot, content_type, body)
        return body, content_type

    def healthy(self) -> tuple[bool, str]:
        snapshot = self.holder.get()
        if snapshot is None:
            return True, "starting"
        # Liveness: cycles keep completing (a wedged scheduler is worth a restart).
        age = time.time() - snapshot.taken_at
        budget = max(30.0, self.interval() * 10)  # the interval in force, after any reload
        if age > budget:
            return False, f"no cycle completed for {age:.0f}s"
        return True, "ok"


def _make_handler(server: WebServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "lagwatch"
        timeout = 10  # a stalled client (or TLS handshake) must not pin a thread forever

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if not server.auth.allows(self.headers.get("Authorization")):
                self._send(401, b"", "text/plain", {"WWW-Authenticate": 'Basic realm="lagwatch"'})
                return
            if path == "/metrics":
                body, content_type = server.metrics(self.headers.get("Accept", ""))
                self._send(200, body, content_type)
            elif path == "/healthz":
                ok, why = server.healthy()
                self._send(200 if ok else 503, why.encode() + b"\n", "text/plain")
            elif path == "/readyz":
                ready = server.holder.get() is not None
                self._send(200 if ready else 503, b"ready\n" if ready else b"waiting for the first poll\n",
                           "text/plain")
            elif path == "/api/status":
                body = json.dumps(snapshot_status(server.holder.get()), indent=1).encode()
                self._send(200, body, "application/json")
            elif path == "/status":
                self._send(200, status_page.render(server.holder.get()).encode(), "text/html; charset=utf-8")
            elif path == "/":
                self._send(200, b"lagwatch: /status /metrics /healthz /readyz /api/status\n", "text/plain")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _send(self, code: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            # The web config's headers (e.g. HSTS) go on every response, a 401 too.
            for name, value in {**(headers or {}), **server.extra_headers}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            log.debug("%s %s", self.address_string(), format % args)

    return Handler
