"""HTTP endpoints: /metrics, /status, /healthz, /readyz, /api/status. Reads snapshots only.

With a web config (exporter-toolkit format) every endpoint is served over TLS and/or
behind basic auth.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from lagwatch import status_page
from lagwatch.config import Config
from lagwatch.export import SnapshotCollector
from lagwatch.snapshot import SnapshotHolder
from lagwatch.status import snapshot_status
from lagwatch.webconfig import BasicAuth, WebConfig, ssl_context

log = logging.getLogger("lagwatch.web")


@dataclass(frozen=True)
class WebSettings:
    """What the web config decides per request, swapped in one step on a reload."""

    source: WebConfig | None
    auth: BasicAuth
    headers: dict[str, str]

    @classmethod
    def of(cls, web: WebConfig | None) -> WebSettings:
        config = web or WebConfig()
        headers = config.http_server_config.headers if config.http_server_config else {}
        return cls(web, BasicAuth(config.basic_auth_users), dict(headers))


class WebServer:
    """A small threaded HTTP server; every response is rendered from the last snapshot.

    ``config`` gives the config in force (it changes on a reload): the interval for
    /healthz. Its web config (TLS, basic auth, headers) is applied at start and by
    ``apply_web_config`` after a reload; TLS itself can only be turned on or off by a
    restart (the listening socket is wrapped once)."""

    def __init__(self, host: str, port: int, holder: SnapshotHolder, config: Callable[[], Config]) -> None:
        self.holder = holder
        self._config = config
        web = config().web
        self.settings = WebSettings.of(web)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(holder.get))
        handler = _make_handler(self)
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        context = ssl_context(web) if web is not None else None
        self.tls = context is not None
        if context is not None:
            # The handshake happens in the request's own thread (on first read), so a
            # client that connects and says nothing cannot block the accept loop.
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True,
                                                    do_handshake_on_connect=False)
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="lagwatch-http", daemon=True)
        self._rendered: tuple[object, str, bytes] | None = None

    def prepare_web_config(self, config: Config) -> Callable[[], None]:
        """A reload's web config, built (may raise: the reload is then rejected) and put in
        force by the returned call: auth and headers for every request from then on, new
        certificates and TLS settings for new connections."""
        web = config.web
        settings = WebSettings.of(web)
        context = ssl_context(web) if web is not None else None

        def apply() -> None:
            if (context is not None) != self.tls:
                log.warning("web config: TLS turned %s: takes effect on restart (auth and headers apply now)",
                            "on" if context is not None else "off")
            elif context is not None:
                assert isinstance(self.httpd.socket, ssl.SSLSocket)
                self.httpd.socket.context = context
            self.settings = settings

        return apply

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
        budget = max(30.0, self._config().interval * 10)  # the interval in force, after any reload
        if age > budget:
            return False, f"no cycle completed for {age:.0f}s"
        return True, "ok"


def _make_handler(server: WebServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "lagwatch"
        settings: WebSettings
        timeout = 10  # a stalled client (or TLS handshake) must not pin a thread forever

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            self.settings = server.settings  # one web config for the whole request
            if not self.settings.auth.allows(self.headers.get("Authorization")):
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
            for name, value in {**(headers or {}), **self.settings.headers}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            log.debug("%s %s", self.address_string(), format % args)

    return Handler
