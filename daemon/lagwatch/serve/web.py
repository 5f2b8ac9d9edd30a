"""HTTP endpoints: /metrics, /status, /healthz, /readyz, /api/status. Reads snapshots only.

With a web config (exporter-toolkit format) every endpoint is served over TLS and/or
behind basic auth.
"""

from __future__ import annotations

import gzip
import json
import logging
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lagwatch.config import Config
from lagwatch.config.web import WebConfig, client_has_allowed_san, ssl_context
from lagwatch.estimate.snapshot import Snapshot, SnapshotHolder
from lagwatch.render.exposition import Family
from lagwatch.render.families import HTTP_CAP, HTTP_CLOSED, HTTP_CONNECTIONS, METRICS_RENDERS, METRICS_SERVED
from lagwatch.render.formats import Format
from lagwatch.serve import status_page
from lagwatch.serve.export import families
from lagwatch.serve.httpmessages import Request, Response
from lagwatch.serve.httpserver import HttpServer
from lagwatch.serve.negotiation import accepts_gzip, choose_format
from lagwatch.serve.scrapepace import Due, PublishPace, Scrapers, scraper_of
from lagwatch.serve.status import snapshot_status
from lagwatch.serve.webauth import BasicAuth

log = logging.getLogger("lagwatch.serve.web")


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


# gzip level 1: a fleet's exposition is label text repeated line after line, which the
# fastest level already shrinks twentyfold; level 6 costs almost four times the CPU
# for 3 % more (docs/benchmarks.md, "gzip").
GZIP_LEVEL = 1
# Added to a render ahead's margin before the expected scrape: a scrape's own jitter.
RENDER_SLACK = 0.05
# Said on every /metrics answer: caches keep one per format and coding asked for.
VARY = "Accept, Accept-Encoding"


class Rendered:
    """One snapshot's exposition: each format scrapers ask of it written once (and gzipped
    once), by the first scrape that asks for it or ahead of it, however many scrapes then
    take it. The families are let go once a format is written (a fleet's are megabytes
    of tuples, and scrapers keep to one format): another format asked of the same snapshot
    builds them again."""

    def __init__(self, snapshot: Snapshot | None, build: Callable[[], list[Family]],
                 ahead_of: list[Due] | None = None, made_at: float = 0.0) -> None:
        self.snapshot = snapshot
        # Rendered ahead of the scrapes expected then (their scrapers' pace): each may be
        # served it once, even after newer snapshots are published (_usable says how old).
        self.ahead_of: list[Due] = list(ahead_of or ())
        self.made_at = made_at
        self._dues = threading.Lock()  # the cycle adds dues while scrapes take them
        self._build = build
        self._families: list[Family] | None = build()
        self._bodies: dict[str, bytes] = {}
        self._gzipped: dict[str, bytes] = {}
        self._lock = threading.Lock()  # scrapes come on the HTTP server's threads

    def body(self, fmt: Format) -> bytes:
        with self._lock:
            body = self._bodies.get(fmt.key)
            if body is None:
                built = self._families if self._families is not None else self._build()
                body = self._bodies[fmt.key] = fmt.render(built)
                self._families = None
            return body

    def take_due(self, scraper: str, now: float, tolerance: float) -> bool:
        """Whether this was rendered ahead of ``scraper``'s scrape now (once)."""
        with self._dues:
            for due in self.ahead_of:
                if due.scraper == scraper and abs(now - due.at) <= min(due.period / 2, tolerance):
                    self.ahead_of.remove(due)  # once: the next scrape is another
                    return True
            return False

    def dues_left(self, now: float, tolerance: float) -> list[Due]:
        """The scrapes this was rendered ahead of that may still come (the others let go)."""
        with self._dues:
            self.ahead_of = [d for d in self.ahead_of if now <= d.at + min(d.period / 2, tolerance)]
            return list(self.ahead_of)

    def add_due(self, due: Due) -> None:
        with self._dues:
            self.ahead_of.append(due)

    def gzipped(self, fmt: Format) -> bytes:
        body = self.body(fmt)
        with self._lock:
            packed = self._gzipped.get(fmt.key)
            if packed is None:
                packed = self._gzipped[fmt.key] = gzip.compress(body, GZIP_LEVEL, mtime=0)
            return packed


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
        self._rendered: Rendered | None = None
        self._scrapes = Scrapers()
        self._render_times: deque[float] = deque(maxlen=5)  # how long the last renders ahead took
        self._publishes = PublishPace()
        # Held by whoever renders a snapshot (a scrape, or the cycle rendering ahead): a
        # scrape that finds a render under way waits for it and takes what it made, rather
        # than render another snapshot beside it on the same cores.
        self._rendering = threading.Lock()
        # Counted for lagwatch_http_metrics_renders/_served (updated under the GIL: a lost
        # count on a race is possible and harmless).
        self.renders = {"ahead": 0, "asked": 0}
        self.served = {"ready": 0, "waited": 0}
        holder.on_publish.append(self._render_ahead)
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
        if request.method not in ("GET", "HEAD"):  # after the credentials: see HttpServer._answer
            return Response(405, b"method not allowed\n", headers={"Allow": "GET, HEAD"})
        path = request.path
        if path == "/metrics":
            body, content_type, coding = self.metrics(request.headers.get("accept"),
                                                      request.headers.get("accept-encoding"), scraper_of(request.peer))
            headers = {"Vary": VARY} if coding is None else {"Vary": VARY, "Content-Encoding": coding}
            return Response(200, body, content_type, headers=headers)
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
            chosen = urllib.parse.parse_qs(request.target.partition("?")[2]).get("cluster", [None])[0]
            return Response(200, status_page.render(self.holder.get(), chosen).encode(), "text/html; charset=utf-8")
        if path == "/":
            return Response(200, b"lagwatch: /status /metrics /healthz /readyz /api/status\n")
        return Response(404, b"not found\n")

    def metrics(self, accept: str | None, accept_encoding: str | None = None,
                scraper: str = "") -> tuple[bytes, str, str | None]:
        """The exposition of the current snapshot in the format ``Accept`` asks for
        (serve/negotiation.py: protobuf, OpenMetrics, text 1.0.0 or 0.0.4), each written once
        per snapshot (and gzipped once, when ``Accept-Encoding`` takes it): scrapes between
        two cycles are served from memory. Returns the body, its exact content type and its
        content coding (None: as is)."""
        choice = choose_format(accept)
        wants_gzip = accepts_gzip(accept_encoding)
        now = time.monotonic()
        self._scrapes.scraped(scraper, now, choice.format, wants_gzip)
        cached = self._usable(self.holder.get(), now, scraper)
        if cached is None:
            with self._rendering:  # a render under way (ahead, or another scrape's) ends first
                snapshot = self.holder.get()
                cached = self._usable(snapshot, now, scraper)
                if cached is None:
                    self._say_why_rendered(scraper, now, snapshot)
                    cached = self._render(snapshot)
                    self.renders["asked"] += 1
            self.served["waited"] += 1
        else:
            self.served["ready"] += 1
        if wants_gzip:
            return cached.gzipped(choice.format), choice.content_type, "gzip"
        return cached.body(choice.format), choice.content_type, None

    def _usable(self, current: Snapshot | None, now: float, scraper: str) -> Rendered | None:
        """What a scrape now may be served without a render: the current snapshot's, the one
        about to be published (rendered ahead), or an older one rendered ahead of this very
        scrape (this scraper's, expected within half its period and an interval of now;
        once), whatever was published since: cycles that do not fit the interval publish at
        uneven gaps, so one, two or more may come between the render and its scrape. How
        old it is then is bounded by when it was begun: no earlier than the next publish
        was expected (at most three intervals, ``PublishPace``) and a margin (under one)
        before the scrape, so some five intervals at most, and two while cycles fit."""
        cached = self._rendered
        if cached is None:
            return None
        if cached.snapshot is current or _later(cached.snapshot, current):
            cached.take_due(scraper, now, self._config().interval)  # served: no later scrape is given it
            return cached
        if cached.snapshot is None or current is None or cached.snapshot.cycles_total >= current.cycles_total:
            return None
        return cached if cached.take_due(scraper, now, self._config().interval) else None

    def _say_why_rendered(self, scraper: str, now: float, current: Snapshot | None) -> None:
        """Why a scrape renders for itself (lagwatch_http_metrics_renders_total{when="asked"}):
        what the last render was of, and for which scrape it was made."""
        if not log.isEnabledFor(logging.DEBUG):
            return
        cached = self._rendered
        dues = ", ".join(f"{due.scraper or '?'}'s due {due.at - now:+.3f}s from now" for due in list(cached.ahead_of)) \
            if cached else ""
        log.debug("/metrics for %s rendered when asked: current cycle %s, last render of cycle %s%s", scraper or "?",
                  current.cycles_total if current else None,
                  cached.snapshot.cycles_total if cached and cached.snapshot else None,
                  f", made ahead of the scrapes {dues}" if dues else "")

    def _render(self, snapshot: Snapshot | None, ahead_of: list[Due] | None = None, made_at: float = 0.0) -> Rendered:
        """A snapshot's families (lagwatch.render.exposition, ~1 µs a series; a format writes
        them in about as long again: a 300-cluster fleet's in ~0.1 s each, bench/exposition.py),
        kept for the formats scrapes ask of it."""
        rendered = Rendered(snapshot, lambda: families(snapshot, also=self._http_samples), ahead_of, made_at)
        cached = self._rendered
        if cached is None or not _later(cached.snapshot, snapshot):  # never over a newer one rendered ahead meanwhile
            self._rendered = rendered
        return rendered

    def _render_ahead(self, snapshot: Snapshot) -> None:
        """Render a snapshot before it is published when the next scrape is due before the
        next cycle's render could be ready: Prometheus scrapes at a steady pace, so that
        scrape is served from memory instead of waiting for a fleet's render (~0.1-0.3 s for
        300 clusters). When a scrape is due before the next publish could have its render
        ready (``PublishPace`` and ``_render_margin``), this cycle's snapshot is rendered and
        served to it (a cycle or more older, at once) and later cycles render nothing for
        it. Before publishing, not after: a scrape arriving meanwhile waits for this render
        rather than render the snapshot before it beside it. The soonest scrape of any
        scraper (an HA pair's two: serve/scrapepace.py), in the format and coding that
        scraper's last one took; a render still waiting for its scrape serves another's
        due within its reach too (one render for an HA pair, not one each in turn); no more
        than a scrape would render, nothing while nobody scrapes, and nothing while a scrape
        is rendering (the cycle never waits on the HTTP side)."""
        try:
            now = time.monotonic()
            interval = self._config().interval
            self._publishes.published(now, interval)
            cached = self._rendered
            pending = cached.dues_left(now, interval) if cached is not None else []
            due = self._scrapes.next_due(now, besides={d.at for d in pending}, late=interval)  # as _usable
            horizon = self._publishes.next_within(interval) + self._render_margin(interval)
            if due is None or due.at > now + horizon:
                if due is not None:
                    log.debug("/metrics not rendered ahead yet: %s's scrape due %+.3fs, past this cycle's reach %.3fs",
                              due.scraper or "?", due.at - now, horizon)
                return
            if not self._rendering.acquire(blocking=False):
                log.debug("/metrics not rendered ahead: a scrape is rendering")
                return  # a scrape is rendering: the cycle does not wait for it
            try:
                if cached is not None and pending and due.at <= cached.made_at + horizon:
                    # Another scraper (an HA pair's other) due within what the render made
                    # for the first may serve: that one, rather than a render each in turn.
                    cached.add_due(due)
                    rendered, what = cached, "kept"
                else:  # fresher, for the scrapes still to come too
                    rendered, what = self._render(snapshot, ahead_of=[*pending, due], made_at=now), "rendered"
                    self.renders["ahead"] += 1
                if due.gzip:
                    rendered.gzipped(due.format)
                else:
                    rendered.body(due.format)
                if what == "rendered":
                    self._render_times.append(time.monotonic() - now)
                log.debug("/metrics of cycle %s %s ahead of %s's scrape due %+.3fs from its start (%.3fs)",
                          rendered.snapshot.cycles_total if rendered.snapshot else None, what, due.scraper or "?",
                          due.at - now, time.monotonic() - now)
            finally:
                self._rendering.release()
        except Exception:  # the scrape will render it, and say what failed
            log.exception("rendering /metrics ahead of the next scrape failed")

    def _render_margin(self, interval: float) -> float:
        """How far past the next cycle's publish a scrape may be due and still be rendered
        for in this cycle (served this cycle's snapshot, a cycle or more older): twice the
        longest of the last few renders (a fleet's render varies by half from one cycle to
        the next on a loaded host, and the next cycle may publish late by as much), so that
        the next cycle's render is never the one such a scrape lands in; less than an
        interval (the served snapshot's age grows with it: ``_usable``)."""
        longest = max(self._render_times, default=0.0)
        return min(2 * longest + RENDER_SLACK, 0.9 * interval)

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


    def _http_samples(self) -> None:
        """The HTTP server's own figures: open connections and why connections were closed
        early (deadline, evicted to make room, refused at the cap, failed handshakes...)."""
        http = self.http
        closed = HTTP_CLOSED.make()
        for reason in ("deadline", "evicted", "refused", "handshake", "client_cert", "reset", "bad_request",
                       "slow_reader"):
            closed.add_metric([reason], http.closed[reason])
        renders, served = METRICS_RENDERS.make(), METRICS_SERVED.make()
        for when, count in self.renders.items():
            renders.add_metric([when], count)
        for how, count in self.served.items():
            served.add_metric([how], count)
        connections, cap = HTTP_CONNECTIONS.make(), HTTP_CAP.make()
        connections.add_metric([], http.open_connections)
        cap.add_metric([], http.connection_cap())


def _later(rendered: Snapshot | None, current: Snapshot | None) -> bool:
    """Whether ``rendered`` comes after ``current``: rendered ahead, about to be published."""
    return rendered is not None and current is not None and rendered.cycles_total > current.cycles_total
