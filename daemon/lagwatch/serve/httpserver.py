"""The HTTP/1.1 server under lagwatch's endpoints, built to stay up under hostile clients.

Why hand-built connection handling: Python's http.server spends a thread per connection
before any auth, has no deadline for a whole request and a listen backlog of 5; aiohttp and
uvicorn cap neither the time to read a request's headers (slowloris) nor the connections
in a way that lets a scraper in while slow clients hold every slot. HTTP parsing itself is
h11's (python-hyper, maintained); this module only decides who gets a connection and for
how long:

- a connection cap below the process's descriptor limit; above it, the connection that has
  waited longest without sending a complete request is closed to make room, and only
  when every connection is busy being answered is the newcomer refused (503, at once);
- a deadline for each request, from accepting (or from its first byte on a kept-alive
  connection) to its last header byte, TLS handshake included; an idle keep-alive wait of
  its own; a deadline to write the response to a client that does not read;
- a listen backlog of 1,024, and accepting on an event loop of its own (a thread), so
  neither scrapes nor floods delay a poll cycle;
- handlers run on a few worker threads (bcrypt and rendering must not stall the loop);
- one log line per failed handshake or reset, never a traceback.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import email.utils
import logging
import resource
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import h11

from lagwatch.config import HttpConfig
from lagwatch.errors import one_line
from lagwatch.serve.httpconn import one_line_exceptions, partial_request, peer_name, reason, refuse, unacknowledged
from lagwatch.serve.httpmessages import Handler, Request, Response, wire_pieces

log = logging.getLogger("lagwatch.http")

BACKLOG = 1024
MAX_HEADER_BYTES = 16 * 1024
MAX_BODY_BYTES = 64 * 1024  # lagwatch's endpoints take no body; a small one is read and dropped


WORKERS = 4  # handler threads: bcrypt and rendering run here, never on the event loop


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    since: float  # when it began waiting for the request it has not completed
    waiting: bool = True  # waiting for a request rather than being answered
    reading: bool = False  # blocked until more of its request arrives
    task: asyncio.Task[None] | None = None
    transport: asyncio.Transport | None = None

    def evictable(self, now: float) -> bool:
        """A connection still owing its request, that has had its chance to send it: one
        just accepted whose request may already be in the buffer is left alone a moment."""
        return self.waiting and (self.reading or now - self.since > 1.0)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()
        else:
            self.sock.close()


class HttpServer:
    """Listens at once (so a bad address fails the caller), serves after ``start``.

    ``handle`` answers a request (on a worker thread); ``tls_context`` gives the TLS context
    for a new connection (None: plain HTTP), so a reload applies to the next connection;
    ``extra_headers`` go on every response, error responses included; ``accept_client``
    may refuse a TLS client after its handshake (client_allowed_sans)."""

    def __init__(self, host: str, port: int, handle: Handler, *,
                 limits: Callable[[], HttpConfig] = HttpConfig,
                 tls_context: Callable[[], ssl.SSLContext | None] = lambda: None,
                 extra_headers: Callable[[], dict[str, str]] = dict,
                 accept_client: Callable[[dict[str, Any] | None], bool] = lambda cert: True,
                 reserved_descriptors: int = 64) -> None:
        self._handle = handle
        self._limits = limits
        self._tls_context = tls_context
        self._extra_headers = extra_headers
        self._accept_client = accept_client
        self._reserved = reserved_descriptors
        # The soft descriptor limit, read once: nothing in lagwatch changes it while running.
        self._descriptors = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        self._socket = socket.create_server((host, port), family=family, backlog=BACKLOG)
        self._socket.setblocking(False)
        self._connections: set[_Connection] = set()
        self.closed: collections.Counter[str] = collections.Counter()  # why connections ended early
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(one_line_exceptions)
        self._workers = ThreadPoolExecutor(WORKERS, thread_name_prefix="lagwatch-http")
        self._thread = threading.Thread(target=self._run, name="lagwatch-http", daemon=True)
        self._accepting: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def connection_cap(self) -> int:
        """The configured cap, kept below the descriptor limit: a server out of descriptors
        cannot even accept a scrape (and the pollers need theirs)."""
        room = self._descriptors - self._reserved if self._descriptors != resource.RLIM_INFINITY else None
        wanted = self._limits().max_connections
        return max(1, wanted if room is None else min(wanted, room))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._shutdown)
            self._thread.join(10)
        self._socket.close()
        self._workers.shutdown(wait=False, cancel_futures=True)

    # -- the loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._accepting = self._loop.create_task(self._accept_forever())
        try:
            self._loop.run_forever()
        finally:
            # Finish every connection's task before closing: a pending task destroyed
            # later would be reported as an error.
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()

    def _shutdown(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
        for connection in list(self._connections):
            connection.close()
        self._loop.stop()

    async def _accept_forever(self) -> None:
        while True:
            try:
                sock, address = await self._loop.sock_accept(self._socket)
            except OSError as exc:
                # Out of descriptors despite the cap (something else holds them): wait a
                # moment rather than spin; the backlog keeps the newcomers meanwhile.
                log.warning("cannot accept a connection: %s", exc.strerror or exc)
                await asyncio.sleep(0.1)
                continue
            connection = _Connection(sock, time.monotonic())
            if not self._admit(connection):
                self.closed["refused"] += 1
                refuse(sock)
                continue
            connection.task = self._loop.create_task(self._serve(peer_name(address), connection))
            await asyncio.sleep(0)  # let accepted connections read their requests between accepts

    def _admit(self, newcomer: _Connection) -> bool:
        if len(self._connections) >= self.connection_cap():
            now = time.monotonic()
            idle = [c for c in self._connections if c.evictable(now)]
            if not idle:
                return False
            oldest = min(idle, key=lambda c: c.since)
            self._connections.discard(oldest)
            oldest.close()  # at once: a task cancelled before it ever ran runs no finally
            if oldest.task is not None:
                oldest.task.cancel()
            self.closed["evicted"] += 1
        self._connections.add(newcomer)
        return True

    async def _serve(self, peer: str, connection: _Connection) -> None:
        limits = self._limits()
        deadline = connection.since + limits.request_timeout
        try:
            context = self._tls_context()
            reader = asyncio.StreamReader(limit=MAX_HEADER_BYTES, loop=self._loop)
            protocol = asyncio.StreamReaderProtocol(reader, loop=self._loop)
            try:
                # The handshake happens here, under the request's deadline.
                async with asyncio.timeout_at(self._at(deadline)):
                    transport, _ = await self._loop.connect_accepted_socket(
                        lambda: protocol, connection.sock, ssl=context,
                        ssl_handshake_timeout=limits.request_timeout if context else None)
            except TimeoutError:
                self.closed["deadline"] += 1
                log.debug("%s: no TLS handshake within %.0fs: closed", peer, limits.request_timeout)
                return
            except (OSError, ssl.SSLError) as exc:
                self.closed["handshake"] += 1
                log.info("%s: TLS handshake failed: %s", peer, reason(exc))
                return
            connection.transport = transport
            writer = asyncio.StreamWriter(transport, protocol, reader, self._loop)
            cert = transport.get_extra_info("peercert") if context else None
            if context is not None and not self._accept_client(cert):
                self.closed["client_cert"] += 1
                return
            if await self._converse(reader, writer, peer, connection, cert, deadline):
                await self._finish(writer)
        except (ConnectionError, ssl.SSLError) as exc:
            self.closed["reset"] += 1
            log.info("%s: connection lost: %s", peer, reason(exc))
        except asyncio.CancelledError:
            pass  # evicted to make room, or the server stops
        finally:
            self._connections.discard(connection)
            connection.close()

    async def _converse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str,
                        connection: _Connection, cert: dict[str, Any] | None, deadline: float) -> bool:
        """Answers requests until the connection is to close: True when it may close
        gracefully, False when its last answer could not be written (cut it at once)."""
        http = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        first = True
        while True:
            connection.waiting = True
            request = await self._read_request(http, reader, writer, peer, connection, deadline if first else None)
            if request is None:
                return True
            connection.waiting = False
            request = dataclasses.replace(request, tls_peer_cert=cert)
            response = await self._loop.run_in_executor(self._workers, self._answer, request)
            if not await self._send(http, writer, request, response):
                return False
            if not await self._taken(writer, connection):
                return False
            if http.our_state is h11.MUST_CLOSE or http.their_state is h11.MUST_CLOSE:
                return True
            try:
                http.start_next_cycle()
            except h11.ProtocolError:
                return True
            first = False
            connection.since = time.monotonic()

    async def _taken(self, writer: asyncio.StreamWriter, connection: _Connection) -> bool:
        """Wait, before the next request, until the client has taken the answer just sent
        (its kernel has acknowledged every byte): True when it has; False when it has not
        within the write deadline (counted a slow reader: cut the connection). A client that
        reads is there by the time it asks again; one that pipelines requests and never
        reads would otherwise have answer after answer rendered into buffers of
        megabytes, each connection holding a slot. Meanwhile the connection may be evicted
        for a newcomer, as one owing its request may."""
        sock = writer.get_extra_info("socket")
        if sock is None:
            return True
        deadline = self._loop.time() + self._limits().request_timeout
        pause = 0.005
        while writer.transport.get_write_buffer_size() or unacknowledged(sock.fileno()):
            if self._loop.time() >= deadline:
                self.closed["slow_reader"] += 1
                return False
            connection.waiting = connection.reading = True
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.1)
        connection.reading = False
        return True

    async def _finish(self, writer: asyncio.StreamWriter) -> None:
        """Close once what is still buffered has been sent, within the write deadline: a
        write's wait returns with up to the buffer's low-water mark unsent, and abort()
        drops it (a /metrics of megabytes on a closing connection arrived cut short)."""
        writer.close()
        try:
            async with asyncio.timeout(self._limits().request_timeout):
                await writer.wait_closed()
        except TimeoutError:
            self.closed["slow_reader"] += 1

    async def _read_request(self, http: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            peer: str, connection: _Connection, deadline: float | None) -> Request | None:
        limits = self._limits()
        request: h11.Request | None = None
        body = 0
        while True:
            try:
                event = http.next_event()
            except h11.RemoteProtocolError as exc:
                self.closed["bad_request"] += 1
                log.debug("%s: bad request: %s", peer, one_line(str(exc)))
                status = exc.error_status_hint
                await self._send_raw(writer, status, b"bad request\n")
                return None
            if event is h11.NEED_DATA:
                connection.reading = True
                if deadline is None:  # kept alive: idle until its next request's first byte
                    try:
                        async with asyncio.timeout(limits.idle_timeout):
                            data = await reader.read(8192)
                    except TimeoutError:
                        return None
                    deadline = time.monotonic() + limits.request_timeout
                else:
                    try:
                        async with asyncio.timeout_at(self._at(deadline)):
                            data = await reader.read(8192)
                    except TimeoutError:
                        self.closed["deadline"] += 1
                        log.debug("%s: request not complete within %.0fs: closed", peer, limits.request_timeout)
                        if request is not None or partial_request(http):
                            await self._send_raw(writer, 408, b"request timeout\n")
                        return None
                connection.reading = False
                http.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                if event.http_version not in (b"1.0", b"1.1"):  # h11 takes any HTTP/x.y
                    await self._send_raw(writer, 505, b"HTTP version not supported (1.0 and 1.1 are)\n")
                    return None
                request = event
                continue
            if isinstance(event, h11.Data):
                body += len(event.data)
                if body > MAX_BODY_BYTES:
                    await self._send_raw(writer, 413, b"request body too large\n")
                    return None
                continue
            if isinstance(event, h11.EndOfMessage) and request is not None:
                headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in request.headers}
                return Request(request.method.decode("ascii"), request.target.decode("latin-1"), headers, peer)
            return None  # ConnectionClosed, or PAUSED

    def _answer(self, request: Request) -> Response:
        """The handler's answer, whatever the method: it says who may ask before it says
        what may be asked (a 405 would tell an unauthenticated client what is served)."""
        try:
            return self._handle(request)
        except Exception as exc:  # one request's failure must not end the server
            log.error("%s %s: %s: %s", request.method, one_line(request.target), type(exc).__name__, exc)
            return Response(500, b"internal error (see lagwatch's log)\n")

    async def _send(self, http: h11.Connection, writer: asyncio.StreamWriter, request: Request,
                    response: Response) -> bool:
        headers = self._headers(response.status, response.content_type, len(response.body), response.headers)
        log.debug("%s \"%s %s\" %d", request.peer, request.method, one_line(request.target, 200), response.status)
        try:
            pieces = wire_pieces(http, response, headers, with_body=request.method != "HEAD")
        except h11.LocalProtocolError as exc:
            log.error("cannot send a response to %s: %s", request.peer, exc)
            return False
        return await self._write(writer, *pieces)

    async def _send_raw(self, writer: asyncio.StreamWriter, status: int, body: bytes) -> None:
        """An error response outside h11's state machine (it refuses to answer a request it
        could not parse), then the connection is closed."""
        headers = self._headers(status, "text/plain; charset=utf-8", len(body), {"Connection": "close"})
        reason = {400: "Bad Request", 408: "Request Timeout", 413: "Content Too Large",
                  431: "Request Header Fields Too Large", 505: "HTTP Version Not Supported"}.get(status, "Error")
        head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{n}: {v}\r\n" for n, v in headers) + "\r\n"
        await self._write(writer, head.encode("latin-1") + body)

    async def _write(self, writer: asyncio.StreamWriter, *chunks: bytes) -> bool:
        for chunk in chunks:
            writer.write(chunk)
        try:
            async with asyncio.timeout(self._limits().request_timeout):
                await writer.drain()  # a client that never reads must not hold its slot forever
        except TimeoutError:
            self.closed["slow_reader"] += 1
            return False
        return True

    def _headers(self, status: int, content_type: str, length: int,
                 extra: dict[str, str]) -> list[tuple[str, str]]:
        headers = {"Server": "lagwatch", "Date": email.utils.formatdate(usegmt=True),
                   "Content-Type": content_type, "Content-Length": str(length), **extra}
        headers.update(self._extra_headers())  # the web config's headers (e.g. HSTS), on every response
        return list(headers.items())

    def _at(self, monotonic_deadline: float) -> float:
        return self._loop.time() + (monotonic_deadline - time.monotonic())
