"""A lean HTTP/1.1 keep-alive client for router→node calls.

The router talks to a handful of known nodes with small JSON bodies, so it needs
none of a general client's machinery (redirects, cookies, proxies, chunked
uploads, DNS). aiohttp's client cost about 40% of the router's CPU per check;
this one is a pool of asyncio protocols per node that write one pre-framed
request and parse one Content-Length (or chunked) response. Errors surface as
OSError (ConnectionError, ssl.SSLError) or TimeoutError; dispatch.py translates them.

`https://` node URLs go over TLS with the given client context (cluster/web/tls.py:
the peer's certificate verified against the cluster CA and the URL's host name,
and a client certificate when mutual TLS is on); without one, the system's
trusted CAs.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

from cluster.web.tls import default_client_context
from router.errors import ProtocolError

MAX_RESPONSE_BYTES = 64 * 1024 * 1024


class _Connection(asyncio.Protocol):
    def __init__(self, tls: bool = False) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.closed = False
        self.reusable = True
        self.tls = tls
        self.received = False  # any byte of an answer yet

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
        self.buffer += data
        if self.waiter is None or self.waiter.done():
            if self.waiter is None:
                # Bytes nobody asked for: the stream is out of step; never reuse it.
                self.reusable = False
            return
        try:
            parsed = self._parse()
        except ProtocolError as exc:
            self.reusable = False
            self.waiter.set_exception(exc)
            return
        if parsed is not None:
            self.waiter.set_result(parsed)

    def _parse(self) -> tuple[int, bytes] | None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > 65536:
                raise ProtocolError("response head too large")
            return None
        head = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        parts = head[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"bad status line {head[0][:80]!r}")
        status = int(parts[1])
        length: int | None = None
        chunked = False
        for line in head[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value.strip())
            elif name == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
            elif name == "connection" and value.strip().lower() == "close":
                self.reusable = False
        start = end + 4
        if chunked:
            return self._parse_chunked(status, start)
        if length is None:
            raise ProtocolError("response without Content-Length")
        if length > MAX_RESPONSE_BYTES:
            raise ProtocolError("response too large")
        if len(self.buffer) - start < length:
            return None
        body = bytes(self.buffer[start : start + length])
        del self.buffer[: start + length]
        return status, body

    def _parse_chunked(self, status: int, start: int) -> tuple[int, bytes] | None:
        body = bytearray()
        at = start
        while True:
            line_end = self.buffer.find(b"\r\n", at)
            if line_end < 0:
                return None
            size = int(bytes(self.buffer[at:line_end]).split(b";")[0] or b"0", 16)
            if size == 0:
                trailer_end = self.buffer.find(b"\r\n", line_end + 2)
                if trailer_end < 0:
                    return None
                del self.buffer[: trailer_end + 2]
                return status, bytes(body)
            chunk_start = line_end + 2
            if len(self.buffer) < chunk_start + size + 2:
                return None
            body += self.buffer[chunk_start : chunk_start + size]
            if len(body) > MAX_RESPONSE_BYTES:
                raise ProtocolError("response too large")
            at = chunk_start + size + 2

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
LateAnswer = Callable[[int, bytes], None]


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _late(conn: _Connection, on_late: LateAnswer) -> Callable[[Answer], None]:
    def done(answer: Answer) -> None:
        conn.close()
        if not answer.cancelled() and answer.exception() is None:
            on_late(*answer.result())

    return done


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
        if self.tls is None:
            _, conn = await loop.create_connection(_Connection, self.host, self.port)
        else:
            # The handshake is part of the connect, so the caller's timeout bounds it.
            _, conn = await loop.create_connection(
                lambda: _Connection(tls=True),
                self.host,
                self.port,
                ssl=self.tls,
                server_hostname=self.host,
            )
        return conn

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None,
        timeout_s: float,
        *,
        fresh: bool = False,
        on_late: LateAnswer | None = None,
    ) -> tuple[int, bytes]:
        """Send one request; (status, body). Raises OSError or TimeoutError.

        `fresh`: on a new connection of its own, closed afterwards (liveness probes must
        not queue behind a pooled connection's request). `on_late`: after a timeout the
        connection stays open and an answer that still comes is handed to it.

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
                if on_late is not None:
                    answer.add_done_callback(_late(conn, on_late))
                    conn = None  # stays open for the late answer
                raise TimeoutError()
            status, raw = answer.result()
        except BaseException:
            # A connection left mid-exchange (timeout, cancel, error) can't be reused.
            if conn is not None:
                if answer is not None and not answer.done():
                    answer.cancel()  # nobody will read what closing it would say
                conn.close()
            raise
        if (
            not fresh
            and conn.reusable
            and not conn.closed
            and not conn.buffer
            and len(self._idle) < self.max_idle
        ):
            conn.waiter = None
            self._idle.append((loop.time(), conn))
        else:
            conn.close()
        return status, raw

    def close(self) -> None:
        for _, conn in self._idle:
            conn.close()
        self._idle.clear()
