"""The load generator's HTTP/1.1 side: what one run sends (`LoadConfig`), every request
encoded once, and one lean keep-alive connection (a raw asyncio Protocol, one request in
flight) that reads each answer's status and body."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import urlsplit


@dataclass(frozen=True)
class LoadConfig:
    url: str
    connections: int
    body: str
    requests: int | None = None
    duration_s: float | None = None
    keys: int = 1
    per_key: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 30.0
    bodies: tuple[str, ...] = ()  # explicit bodies, sent round robin (instead of body/keys)


class HttpError(Exception):
    """The answer could not be read as HTTP/1.1 with a Content-Length."""


# ---------------------------------------------------------------- requests and answers


def encode_requests(config: LoadConfig) -> list[bytes]:
    """The K distinct complete HTTP/1.1 requests (`{i}` in the body = key index)."""
    parts = urlsplit(config.url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    headers = {"Host": f"{parts.hostname}:{parts.port or 80}", "Content-Type": "application/json"}
    headers.update(config.headers)
    head = f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    bodies = config.bodies or tuple(
        config.body.replace("{i}", str(index)) for index in range(config.keys)
    )
    return [
        f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
        for body in (text.encode() for text in bodies)
    ]


def _content_length(lowered: bytes) -> int:
    at = lowered.find(b"\r\ncontent-length:")
    if at < 0:
        raise HttpError("answer without Content-Length")
    stop = lowered.find(b"\r\n", at + 17)
    return int(lowered[at + 17 : stop if stop >= 0 else len(lowered)])


class LoadConnection(asyncio.Protocol):
    """One keep-alive connection with at most one request in flight."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[tuple[int, bytes, float]] | None = None
        self.sent_at = 0.0
        self.buf = bytearray()
        self.need = -1
        self.body_at = 0
        self.status = 0
        self.last = False

    @property
    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not an asyncio.Transport subclass, but quacks like one.
        self.transport = cast(asyncio.Transport, transport)

    def request(self, payload: bytes) -> asyncio.Future[tuple[int, bytes, float]]:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.sent_at = time.perf_counter()
        self.transport.write(payload)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        self.buf += data
        try:
            if self.need < 0 and not self._read_head():
                return
        except (HttpError, ValueError) as exc:
            self.fail(HttpError(f"bad answer: {exc}"))
            return
        if len(self.buf) < self.need:
            return
        body = bytes(self.buf[self.body_at : self.need])
        del self.buf[: self.need]
        self.need = -1
        if self.last and self.transport is not None:
            self.transport.close()
        self._resolve((self.status, body, time.perf_counter() - self.sent_at))

    def _read_head(self) -> bool:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        head = bytes(self.buf[:end]).lower()
        if not head.startswith(b"http/1."):
            raise HttpError(repr(head[:40]))
        self.status = int(head[9:12])
        self.body_at = end + 4
        self.need = self.body_at + _content_length(head)
        # The server will close after this answer: do not race its FIN with a new request.
        self.last = b"\r\nconnection: close" in head
        return True

    def _resolve(self, answer: tuple[int, bytes, float]) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(answer)

    def fail(self, exc: BaseException) -> None:
        """Fail the request in flight and drop the connection (its state is unknown)."""
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.fail(exc or ConnectionResetError("connection closed by the server"))
