"""A lean HTTP/1.1 front for the router's hot endpoints.

One `FrontConnection` per client connection parses HTTP/1.1 with httptools (llhttp) and
answers `POST /v1/check`, `POST /v1/check/batch` and the lease calls (`POST
/v1/lease/renew`, `/v1/lease/release`) itself, with the code the aiohttp
handlers run (router/api/check_answers.py, router/api/problems.py) and the same bytes on the wire
(router/front/answer_bytes.py): aiohttp's web layer costs about as much as the check itself.

Everything else stays aiohttp's. On the first request the front does not fully
understand (another path or method, HTTP/1.1 without Host, an Expect, Upgrade,
Content-Encoding or unusual Transfer-Encoding header, a body over 1 MiB, a request
llhttp rejects), the connection stops reading, lets the answers it owes be written, then
becomes aiohttp's: a protocol from aiohttp's `web.Server` takes over the transport and
gets every byte from the start of that request. A request line of an HTTP version other
than 1.0 and 1.1 is answered 505 over HTTP/1.1 and the connection closed (aiohttp would
answer in the version claimed).

Pipelined requests run concurrently and are answered in order. Idle keep-alive
connections are closed after aiohttp's keep-alive timeout by one periodic sweep, and so
is one whose request has not arrived whole that long after its first byte.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import cast

import httptools
from aiohttp import web

from cluster.web.connections import KEEPALIVE_S
from cluster.web.problem import Problem, internal_error, version_not_supported
from router.api.check_answers import (
    CHECK_BATCH_PATH,
    CHECK_PATH,
    MAX_BODY,
    JsonAnswer,
    batch_answer,
    check_answer,
)
from router.api.handler_tools import ROUTER
from router.api.leases import RELEASE_PATH, RENEW_PATH, release_answer, renew_answer
from router.api.problems import problem_of
from router.front.answer_bytes import JSON, PROBLEM_JSON, answer_bytes
from router.front.hand_over import Received, hand_over
from router.service import Router

__all__ = ["FrontConnection", "FrontServer", "front_for"]

SWEEP_S = 1.0  # idle connections are closed between keepalive_s and this later
MAX_OWED = 64  # answers owed on one connection before it stops reading
REGION_LIMIT = 4 * 1024 * 1024  # bytes kept for a hand-over (Received)

Endpoint = Callable[[Router, bytes], Awaitable[JsonAnswer]]
_ENDPOINTS: dict[bytes, tuple[str, Endpoint]] = {
    CHECK_PATH.encode(): (CHECK_PATH, check_answer),
    CHECK_BATCH_PATH.encode(): (CHECK_BATCH_PATH, batch_answer),
    RENEW_PATH.encode(): (RENEW_PATH, renew_answer),
    RELEASE_PATH.encode(): (RELEASE_PATH, release_answer),
}
# Requests whose meaning only aiohttp implements, or that aiohttp may refuse, go to
# aiohttp: these headers, a Transfer-Encoding other than chunked, a duplicate of a
# header aiohttp takes once (web_protocol/_http_parser), or headers near its limits.
_AIOHTTP_HEADERS = frozenset((b"expect", b"upgrade", b"content-encoding", b"sec-websocket-key1"))
_LONG_LENGTH = len(str(MAX_BODY))  # digits of a Content-Length that may be over MAX_BODY
_SINGLETONS = frozenset(
    b"content-length content-location content-range content-type etag host max-forwards "
    b"server transfer-encoding user-agent".split()
)
_MAX_FIELD = 8190  # aiohttp's max_field_size
_MAX_HEADERS = 128  # aiohttp's max_headers
_HTTP_1 = frozenset(("1.0", "1.1"))


class _HandOver(Exception):
    """Raised in a parser callback: this request and the rest of the connection go to
    aiohttp."""


class _Discard(Exception):
    """Raised in a parser callback: the connection takes no more requests."""


class _Owed:
    """One answer owed, in request order, and its making."""

    __slots__ = ("close", "data", "http10", "keep_alive", "task")

    def __init__(self, http10: bool, keep_alive: bool) -> None:
        self.http10 = http10
        self.keep_alive = keep_alive
        self.close = not keep_alive
        self.data: bytes | None = None
        self.task: asyncio.Task[None] | None = None

    async def make(
        self, connection: FrontConnection, endpoint: tuple[str, Endpoint], body: bytes
    ) -> None:
        """The answer of `endpoint` to `body`; written, with those after it that are
        ready, once it heads the connection's queue."""
        path, answer = endpoint
        router = connection.router
        started = time.perf_counter()
        try:
            status, payload, headers = await answer(router, body)
            content_type = JSON
        except Exception as exc:
            problem = problem_of(exc)
            if problem is None:
                connection.front.logger.exception("unhandled error on POST %s", path)
                problem = internal_error()
            status, payload, headers = problem.status, problem.body(), problem.headers
            content_type = PROBLEM_JSON
        self.data = answer_bytes(
            self.http10, self.keep_alive, status, content_type, payload, headers
        )
        elapsed = time.perf_counter() - started  # as the observe middleware: before writing
        owed = connection.owed
        if owed and self is owed[0]:
            connection.write_ready()
        router.metrics.responded(path, status, elapsed)


class FrontServer:
    """The protocol factory given to `loop.create_server`, and its connections."""

    def __init__(
        self,
        server: web.Server,
        router: Router,
        logger: logging.Logger,
        keepalive_s: float = KEEPALIVE_S,
        region_limit: int = REGION_LIMIT,
    ) -> None:
        self.server = server
        self.keepalive_s = keepalive_s
        self.region_limit = region_limit
        self.router = router
        self.logger = logger
        self.loop = asyncio.get_running_loop()
        self.connections: set[FrontConnection] = set()
        self.closing = False
        self._sweeper: asyncio.TimerHandle | None = None
        self._all_gone = asyncio.Event()

    def __call__(self) -> FrontConnection:
        if self._sweeper is None and not self.closing:
            self._sweeper = self.loop.call_later(SWEEP_S, self._sweep)
        return FrontConnection(self)

    def _sweep(self) -> None:
        idle_since = self.loop.time() - self.keepalive_s
        for connection in list(self.connections):
            connection.close_if_idle(idle_since)
        self._sweeper = self.loop.call_later(SWEEP_S, self._sweep)

    def forget(self, connection: FrontConnection) -> None:
        self.connections.discard(connection)
        if self.closing and not self.connections:
            self._all_gone.set()

    async def shutdown(self, grace_s: float) -> None:
        """Close idle connections, let the answers owed be written (then close), up to
        `grace_s` seconds; abort what is left."""
        self.closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for connection in list(self.connections):
            connection.stop()
        if not self.connections:
            return
        try:
            await asyncio.wait_for(self._all_gone.wait(), grace_s)
        except TimeoutError:
            for connection in list(self.connections):
                connection.abort()


def front_for(
    app: web.Application, keepalive_s: float = KEEPALIVE_S
) -> Callable[[web.Server], FrontServer]:
    """The `front` of cluster.web.serve for the router `app`."""

    def build(server: web.Server) -> FrontServer:
        return FrontServer(server, app[ROUTER], app.logger, keepalive_s)

    return build


class FrontConnection(asyncio.Protocol):
    """One client connection, until it closes or is handed to aiohttp."""

    def __init__(self, front: FrontServer) -> None:
        self.front = front
        self.router = front.router
        self.loop = front.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.owed: deque[_Owed] = deque()
        self.received = Received(front.region_limit)
        self.in_message = False
        self.url = b""
        self.body: list[bytes] = []
        self.body_size = 0
        self.seen: set[bytes] = set()  # the singleton headers of the request
        self.headers = 0
        self.for_aiohttp = False
        self.leftover: bytes | None = None  # set once handing over: what aiohttp gets
        self.closing = False  # takes no more requests; closes once its answers are written
        self.reading = True
        self.write_paused = False
        self.lost = False
        self.eof = False
        self.last_active = self.loop.time()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        self.front.connections.add(self)
        if self.front.closing:
            self.stop()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = True
        self.transport = None
        self.front.forget(self)

    def pause_writing(self) -> None:
        self.write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._after_writes()

    def eof_received(self) -> bool:
        self.eof = True
        self.closing = True
        if self.leftover is not None:
            return True  # handed over with the request it has; aiohttp sees the EOF
        return bool(self.owed)  # write what is owed, then close

    def data_received(self, data: bytes) -> None:
        if self.closing or self.leftover is not None:
            return
        self.received.add(data, self.in_message)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _Discard):
                return
            if not isinstance(exc.__context__, _HandOver):
                self.front.logger.error("front parser callback failed", exc_info=exc.__context__)
            self._start_hand_over()
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self._start_hand_over()  # aiohttp answers it as it always has (a 400, say)

    # httptools callbacks

    def on_message_begin(self) -> None:
        if self.closing:
            raise _Discard
        self.in_message = True
        self.last_active = self.loop.time()
        self.url = b""
        self.body = []
        self.body_size = 0
        self.seen.clear()
        self.headers = 0
        self.for_aiohttp = False

    def on_url(self, url: bytes) -> None:
        self.url += url  # llhttp may deliver it in pieces

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        seen = self.seen
        if name in _SINGLETONS:
            if (
                name in seen
                or (name == b"transfer-encoding" and value.strip().lower() != b"chunked")
                # a body declared too large: aiohttp answers the 413 without waiting for it
                or (name == b"content-length" and len(value) >= _LONG_LENGTH)
            ):
                self.for_aiohttp = True
            seen.add(name)
        elif name in _AIOHTTP_HEADERS:
            self.for_aiohttp = True
        self.headers += 1
        if (
            len(value) >= _MAX_FIELD
            or len(name) >= _MAX_FIELD
            or self.headers >= _MAX_HEADERS
            or b"\0" in value
        ):
            self.for_aiohttp = True

    def on_headers_complete(self) -> None:
        version = self.parser.get_http_version()
        if version not in _HTTP_1:  # llhttp reads HTTP/0.9 and HTTP/2.0 request lines too
            self._refuse(version_not_supported(version))
            raise _Discard
        if (
            self.for_aiohttp
            or self.parser.get_method() != b"POST"
            or self.url not in _ENDPOINTS
            or not ((version == "1.1" and b"host" in self.seen) or version == "1.0")
        ):
            raise _HandOver

    def on_body(self, body: bytes) -> None:
        self.body_size += len(body)
        if self.body_size > MAX_BODY:
            raise _HandOver  # aiohttp answers the 413, as it always has
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.in_message = False
        self.received.completed += 1
        owed = _Owed(self.parser.get_http_version() == "1.0", self.parser.should_keep_alive())
        self.owed.append(owed)
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        owed.task = self.loop.create_task(owed.make(self, _ENDPOINTS[self.url], body))
        if owed.close:
            self.closing = True
        if owed.close or len(self.owed) >= MAX_OWED:
            self._update_reading()

    # writing answers

    def write_ready(self) -> None:
        """Write every answer ready at the head of the queue, in one write."""
        transport = self.transport
        if self.lost or transport is None:
            self.owed.clear()
            return
        ready: list[bytes] = []
        close = False
        owed = self.owed
        while owed and owed[0].data is not None:
            done = owed.popleft()
            assert done.data is not None
            ready.append(done.data)
            if done.close:
                close = True
                owed.clear()
                break
        transport.write(ready[0] if len(ready) == 1 else b"".join(ready))
        self.last_active = self.loop.time()
        if close:
            transport.close()
            return
        self._after_writes()

    def _after_writes(self) -> None:
        transport = self.transport
        if transport is None or self.owed:
            self._update_reading()
            return
        if self.leftover is not None:
            if not self.write_paused:
                self._hand_over(transport, self.leftover)
            return
        if self.closing:
            transport.close()
            return
        self._update_reading()

    def _update_reading(self) -> None:
        reading = not (
            self.write_paused
            or self.closing
            or self.leftover is not None
            or len(self.owed) >= MAX_OWED
        )
        if reading != self.reading and self.transport is not None:
            self.reading = reading
            if reading:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    # hand-over and closing

    def _refuse(self, problem: Problem) -> None:
        """Answer `problem` over HTTP/1.1 after the answers owed, then close: the rest of
        the connection cannot be read."""
        owed = _Owed(http10=False, keep_alive=False)
        owed.data = answer_bytes(
            False, False, problem.status, PROBLEM_JSON, problem.body(), problem.headers
        )
        self.owed.append(owed)
        self.closing = True
        self._update_reading()
        if owed is self.owed[0]:
            self.write_ready()

    def _start_hand_over(self) -> None:
        self.leftover = self.received.take_unfinished()
        self._update_reading()
        if not self.owed and self.transport is not None and not self.write_paused:
            self._hand_over(self.transport, self.leftover)

    def _hand_over(self, transport: asyncio.Transport, leftover: bytes) -> None:
        self.front.forget(self)
        self.transport = None
        hand_over(transport, self.front.server, leftover, paused=not self.reading, eof=self.eof)

    def close_if_idle(self, idle_since: float) -> None:
        """Closed when no answer is owed and nothing was answered or begun since
        `idle_since`: idle between requests, or a request that did not arrive whole in
        that time (however slowly its bytes trickle in)."""
        if (
            self.transport is not None
            and not self.owed
            and self.leftover is None
            and self.last_active < idle_since
        ):
            self.transport.close()

    def stop(self) -> None:
        """No more requests: close now if nothing is owed, else once it is written."""
        self.closing = True
        if self.transport is None:
            return
        if not self.owed and self.leftover is None:
            self.transport.close()
        else:
            self._update_reading()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
