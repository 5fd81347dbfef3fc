"""A lean HTTP/1.1 keep-alive client for router→node calls.

The router talks to a handful of known nodes with small JSON bodies, so it needs
none of a general client's machinery (redirects, cookies, proxies, chunked
uploads, DNS). aiohttp's client cost about 40% of the router's CPU per check;
this one is a pool of asyncio protocols per node that write one pre-framed
request and read its answer with httptools (llhttp, as the router's front parses
requests). Errors surface as OSError (ConnectionError, ssl.SSLError, ProtocolError for an
answer that is not HTTP/1.1 we understand) or TimeoutError; router/channel/node_control.py
translates them for a member node. It is the router's one client of nodes' HTTP ports.

`https://` node URLs go over TLS with the given client context (cluster/web/tls.py:
the peer's certificate verified against the cluster CA and the URL's host name,
and a client certificate when mutual TLS is on); without one, the system's
trusted CAs.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import cast
from urllib.parse import urlsplit

import httptools

from cluster.web.connect import connect
from cluster.web.tls import default_client_context
from router.errors import ProtocolError

MAX_RESPONSE_BYTES = 64 * 1024 * 1024
MAX_HEAD_BYTES = 65536


class _Connection(asyncio.Protocol):
    """One keep-alive connection; httptools (llhttp) parses its answers."""

    def __init__(self, tls: bool = False) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.closed = False
        self.reusable = True
        self.tls = tls
        self.received = False  # any byte of an answer yet
        # The answer being read.
        self.head_size = 0  # bytes received while its head was incomplete
        self.head_done = False
        self.length: int | None = None  # its Content-Length
        self.chunked = False
        self.body: list[bytes] = []
        self.body_size = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; same interface.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc or ConnectionResetError(self._why_closed()))

    def _why_closed(self) -> str:
        if self.tls and not self.received:
            # With TLS 1.3 a server checks our certificate after our side of the
            # handshake is done: its refusal arrives as a close, before any answer.
            return (
                "node closed the TLS connection before answering (a node that requires "
                "client certificates does so when it does not accept ours)"
            )
        return "node closed the connection"

    def data_received(self, data: bytes) -> None:
        self.received = True
        waiter = self.waiter
        if waiter is None or waiter.done():
            # Bytes nobody asked for: the stream is out of step; never reuse it.
            self.reusable = False
            return
        try:
            self.parser.feed_data(data)
            if not self.head_done:
                self.head_size += len(data)
                if self.head_size > MAX_HEAD_BYTES:
                    raise ProtocolError("response head too large")
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            self._failed(cause if isinstance(cause, ProtocolError) else ProtocolError(str(exc)))
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._failed(ProtocolError(f"unreadable response: {exc}"))
        except ProtocolError as exc:
            self._failed(exc)

    def _failed(self, error: ProtocolError) -> None:
        self.reusable = False
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(error)

    # httptools callbacks

    def on_message_begin(self) -> None:
        if self.waiter is None or self.waiter.done():
            raise ProtocolError("a second answer to one request")
        self.head_size = 0
        self.head_done = False
        self.length = None
        self.chunked = False
        self.body = []
        self.body_size = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length":
            self.length = int(value)  # llhttp has checked it is a number
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            self.chunked = True

    def on_headers_complete(self) -> None:
        self.head_done = True
        if self.chunked:
            return
        if self.length is None:
            raise ProtocolError("response without Content-Length")
        if self.length > MAX_RESPONSE_BYTES:
            raise ProtocolError("response too large")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.body_size += len(body)
        if self.body_size > MAX_RESPONSE_BYTES:
            raise ProtocolError("response too large")

    def on_message_complete(self) -> None:
        if not self.parser.should_keep_alive():
            self.reusable = False  # Connection: close
        body = self.body
        raw = body[0] if len(body) == 1 else b"".join(body)
        assert self.waiter is not None
        self.waiter.set_result((self.parser.get_status_code(), raw))

    def send(self, request: bytes) -> asyncio.Future[tuple[int, bytes]]:
        """Write one request; the future of its response (status, body)."""
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


Answer = asyncio.Future[tuple[int, bytes]]


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class HttpPool:
    """Keep-alive connections to one node; at most `max_idle` are kept open, none longer
    than IDLE_S (well under aiohttp's 75 s keep-alive, so the node never closes a
    connection we are about to reuse: a reset always means the node went away)."""

    IDLE_S = 30.0

    def __init__(
        self,
        base_url: str,
        headers: dict[str, str],
        max_idle: int = 64,
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or url.hostname is None:
            raise ValueError(
                f"node URL must be http://host:port or https://host:port, not {base_url!r}"
            )
        self.host = url.hostname
        self.tls: ssl.SSLContext | None = None
        if url.scheme == "https":
            self.tls = ssl_context or default_client_context()
        self.port = url.port or (443 if self.tls else 80)
        self.prefix = url.path.rstrip("/")
        host_header = f"{self.host}:{self.port}"
        self._head_tail = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._host_line = f"Host: {host_header}\r\n"
        self.max_idle = max_idle
        self._idle: list[tuple[float, _Connection]] = []

    def _frame(self, method: str, path: str, body: bytes | None) -> bytes:
        head = f"{method} {self.prefix}{path} HTTP/1.1\r\n{self._host_line}{self._head_tail}"
        if body is None:
            return (head + "\r\n").encode()
        return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    async def _connection(self, fresh: bool) -> _Connection:
        loop = asyncio.get_running_loop()
        while self._idle and not fresh:
            since, conn = self._idle.pop()
            if not conn.closed and conn.reusable and loop.time() - since < self.IDLE_S:
                return conn
            conn.close()
        tls = self.tls is not None
        return await connect(lambda: _Connection(tls=tls), self.host, self.port, self.tls)

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None,
        timeout_s: float,
        *,
        fresh: bool = False,
    ) -> tuple[int, bytes]:
        """Send one request; (status, body). Raises OSError or TimeoutError.

        `fresh`: on a new connection of its own, closed afterwards (liveness probes must
        not queue behind a pooled connection's request).

        The timeout fails the request only if no answer completed it first: after a
        stall of this process, an answer already in the socket buffer is read and wins,
        instead of a timeout measuring our own stall.
        """
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + timeout_s
        conn: _Connection | None = None
        answer: Answer | None = None
        try:
            async with asyncio.timeout_at(give_up_at):
                conn = await self._connection(fresh)
            answer = conn.send(self._frame(method, path, body))
            gave_up: asyncio.Future[None] = loop.create_future()
            timer = loop.call_at(give_up_at, _resolve, gave_up)
            try:
                await asyncio.wait((answer, gave_up), return_when=asyncio.FIRST_COMPLETED)
            finally:
                timer.cancel()
            if not answer.done():
                raise TimeoutError()
            status, raw = answer.result()
        except BaseException:
            # A connection left mid-exchange (timeout, cancel, error) can't be reused.
            if conn is not None:
                if answer is not None and not answer.done():
                    answer.cancel()  # nobody will read what closing it would say
                conn.close()
            raise
        if not fresh and conn.reusable and not conn.closed and len(self._idle) < self.max_idle:
            conn.waiter = None
            self._idle.append((loop.time(), conn))
        else:
            conn.close()
        return status, raw

    def close(self) -> None:
        for _, conn in self._idle:
            conn.close()
        self._idle.clear()


async def get_once(
    url: str, path: str, token: str | None, ssl_context: ssl.SSLContext | None, timeout_s: float
) -> tuple[int, bytes]:
    """One GET of `path` at the node `url` (not a member yet, say) on a connection of its
    own, with the cluster `token` if given; (status, body). Raises ValueError (not an
    http(s) URL), OSError or TimeoutError."""
    pool = HttpPool(
        url, {"Authorization": f"Bearer {token}"} if token else {}, ssl_context=ssl_context
    )
    return await pool.request("GET", path, None, timeout_s, fresh=True)
