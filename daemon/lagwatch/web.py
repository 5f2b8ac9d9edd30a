"""HTTP endpoints: /metrics, /status, /healthz, /readyz, /api/status. Reads snapshots only.

With a web config (exporter-toolkit format) every endpoint is served over TLS and/or
behind basic auth.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from lagwatch import status_page
from lagwatch.config import Config
from lagwatch.export import SnapshotCollector
from lagwatch.httpserver import HttpServer, Request, Response
from lagwatch.snapshot import SnapshotHolder
from lagwatch.status import snapshot_status
from lagwatch.webconfig import BasicAuth, WebConfig, client_has_allowed_san, ssl_context

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

    def accepts_client(self, cert: dict[str, Any] | None) -> bool:
        tls = self.source.tls_server_config if self.source is not None else None
        if tls is None or tls.client_allowed_sans is None:
            return True
        return client_has_allowed_san(cert, tls.client_allowed_sans)


class WebServer:
    """lagwatch's endpoints on an ``HttpServer``; every response is rendered from the last
    snapshot.

    ``config`` gives the config in force (it changes on a reload): the interval for
    /healthz, the HTTP limits. Its web config (TLS, basic auth, headers) is applied at start
    and by ``prepare_web_config`` after a reload, to every new connection and request."""

    def __init__(self, host: str, port: int, holder: SnapshotHolder, config: Callable[[], Config],
                 reserved_descriptors: int = 64) -> None:
        self.holder = holder
        self._config = config
        web = config().web
        self.settings = WebSettings.of(web)
        self._context = ssl_context(web) if web is not None else None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(holder.get))
        self.registry.register(_HttpCollector(self))
        self._rendered: tuple[object, str, bytes] | None = None
        self.http = HttpServer(host, port, self.handle, limits=lambda: config().http,
                               tls_context=lambda: self._context,
                               extra_headers=lambda: self.settings.headers,
                               accept_client=lambda cert: self.settings.accepts_client(cert),
                               reserved_descriptors=reserved_descriptors)
        self._warn_plain_auth(web)

    @property
    def tls(self) -> bool:
        return self._context is not None

    def prepare_web_config(self, config: Config) -> Callable[[], None]:
        """A reload's web config, built (may raise: the reload is then rejected) and put in
        force by the returned call: auth and headers for every request from then on, TLS
        (certificates, settings, on or off) for new connections."""
        web = config.web
        settings = WebSettings.of(web)
        context = ssl_context(web) if web is not None else None

        def apply() -> None:
            if (context is not None) != self.tls:
                log.warning("web config: TLS turned %s for new connections", "on" if context is not None else "off")
            self._context = context
            self.settings = settings
            self._warn_plain_auth(web)

        return apply

    @staticmethod
    def _warn_plain_auth(web: WebConfig | None) -> None:
        if web is not None and web.basic_auth_users and web.tls_server_config is None:
            log.warning("web config: basic auth without TLS: passwords cross the network in clear "
                        "(add tls_server_config)")

    @property
    def port(self) -> int:
        return self.http.port

    def start(self) -> None:
        self.http.start()

    def stop(self) -> None:
        self.http.stop()

    def handle(self, request: Request) -> Response:
        settings = self.settings  # one web config for the whole request
        if not settings.auth.allows(request.headers.get("authorization")):
            return Response(401, b"", headers={"WWW-Authenticate": 'Basic realm="lagwatch"'})
        path = request.path
        if path == "/metrics":
            body, content_type = self.metrics(request.headers.get("accept", ""))
            return Response(200, body, content_type)
        if path == "/healthz":
            ok, why = self.healthy()
            return Response(200 if ok else 503, why.encode() + b"\n")
        if path == "/readyz":
            ready = self.holder.get() is not None
            return Response(200 if ready else 503, b"ready\n" if ready else b"waiting for the first poll\n")
        if path == "/api/status":
            body = json.dumps(snapshot_status(self.holder.get()), indent=1).encode()
            return Response(200, body, "application/json")
        if path == "/status":
            return Response(200, status_page.render(self.holder.get()).encode(), "text/html; charset=utf-8")
        if path == "/":
            return Response(200, b"lagwatch: /status /metrics /healthz /readyz /api/status\n")
        return Response(404, b"not found\n")

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


class _HttpCollector(Collector):
    """The HTTP server's own figures: open connections and why connections were closed
    early (deadline, evicted to make room, refused at the cap, failed handshakes...)."""

    def __init__(self, web: WebServer) -> None:
        self.web = web

    def collect(self) -> Iterable[Metric]:
        http = self.web.http
        yield GaugeMetricFamily("lagwatch_http_connections", "Open HTTP connections.", http.open_connections)
        yield GaugeMetricFamily("lagwatch_http_connection_cap",
                                "Open HTTP connections allowed (kept below the descriptor limit).",
                                http.connection_cap())
        closed = CounterMetricFamily("lagwatch_http_connections_closed", "HTTP connections closed early, by reason.",
                                     labels=["reason"])
        for reason in ("deadline", "evicted", "refused", "handshake", "client_cert", "reset", "bad_request",
                       "slow_reader"):
            closed.add_metric([reason], http.closed[reason])
        yield closed
