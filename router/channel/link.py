"""The router's end of a node's hot-path channel (cluster/wire/channel.py,
node/edge/channel_server.py).

One long-lived connection per node carries every batch as a frame tagged with a
request id; replies are matched by id, in whatever order they come. The connection is
opened on first use, and again after it was lost: the node's `/healthz` names its
channel port (a restarted node may have a new one), then a `Hello` with the cluster
token must be answered `Welcome`. `https://` nodes are reached over TLS with the
router's client context, as their HTTP port is.

A batch's outcome is handed to a callback (no task, no future per batch): the node's
`Reply`, or the exception that ended it: OSError (refused, reset, closed, TLS) or
TimeoutError (no reply within its time). Timeouts share one timer, armed for the oldest
batch. A batch that timed out stays registered: if its reply still comes, `on_late`
gets it (the router takes back what it consumed).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from typing import cast
from urllib.parse import urlsplit

import msgspec

from cluster import wire
from cluster.web.connect import connect
from cluster.web.tls import default_client_context

__all__ = ["Done", "Late", "NodeLink"]

log = logging.getLogger("shardlimit.dispatch")

Done = Callable[[wire.Reply | BaseException], None]
Late = Callable[[wire.Reply], None]
# Where the node's channel listens: awaited with a timeout, raises OSError/TimeoutError.
Discover = Callable[[float], Awaitable[int]]


class _Call:
    __slots__ = ("done", "give_up_at", "on_late")

    def __init__(self, done: Done | None, give_up_at: float, on_late: Late | None) -> None:
        self.done = done  # None once answered by a timeout: the reply is late
        self.give_up_at = give_up_at
        self.on_late = on_late


def _deliver(done: Done, outcome: wire.Reply | BaseException) -> None:
    try:
        done(outcome)
    except Exception:  # a bug in the callback must not break the connection
        log.exception("handling a node's reply failed")


class _Protocol(asyncio.Protocol):
    def __init__(self, link: NodeLink, tls: bool) -> None:
        self.link = link
        self.tls = tls
        self.transport: asyncio.Transport | None = None
        self.frames = wire.FrameBuffer()
        self.welcome: asyncio.Future[wire.Welcome] = asyncio.get_running_loop().create_future()
        self.refused: str | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; same interface.
        self.transport = cast(asyncio.Transport, transport)

    def _why_closed(self) -> str:
        if self.refused is not None:
            return f"node refused the channel: {self.refused}"
        if self.tls and not self.welcome.done():
            # With TLS 1.3 a server checks our certificate after our side of the
            # handshake is done: its refusal arrives as a close, before any answer.
            return (
                "node closed the TLS connection before answering (a node that requires "
                "client certificates does so when it does not accept ours)"
            )
        return "node closed the connection"

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        error = ConnectionResetError(self._why_closed()) if exc is None else exc
        if not self.welcome.done():
            self.welcome.set_exception(error)
        self.link._lost(self, error)

    def data_received(self, data: bytes) -> None:
        try:
            bodies = self.frames.feed(data)
            for body in bodies:
                message = wire.decode_channel_out(body)
                if isinstance(message, wire.Reply):
                    self.link._answered(message)
                elif isinstance(message, wire.Welcome) and not self.welcome.done():
                    self.welcome.set_result(message)
                elif isinstance(message, wire.Refused):
                    self.refused = message.detail
                else:
                    raise ValueError(f"unexpected {type(message).__name__} frame")
        except (ValueError, msgspec.ValidationError, msgspec.DecodeError) as exc:
            log.error("node channel %s: out of step: %s", self.link.url, exc)
            self.refused = f"unreadable frame: {exc}"
            self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class NodeLink:
    def __init__(
        self,
        url: str,
        token: str | None,
        discover: Discover,
        *,
        ssl_context: ssl.SSLContext | None = None,
        connect_timeout_s: float = 1.0,
    ) -> None:
        parts = urlsplit(url)
        if parts.hostname is None:
            raise ValueError(f"node URL without a host: {url!r}")
        self.url = url
        self.host = parts.hostname
        self.tls: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self.tls = ssl_context or default_client_context()
        self.token = token
        self.discover = discover
        self.connect_timeout_s = connect_timeout_s
        self.welcome: wire.Welcome | None = None
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._queued: list[tuple[int, bytes]] = []  # written once connected
        self._calls: dict[int, _Call] = {}
        self._order: deque[int] = deque()  # ids in the order their give_up_at comes
        self._timer: asyncio.TimerHandle | None = None
        self._ids = 0
        self.connects = 0  # connections opened, for tests and /metrics

    @property
    def waiting(self) -> int:
        """Batches sent and not answered (late ones included)."""
        return len(self._calls)

    def send(
        self,
        deadline_ms: int,
        ops: list[wire.Op],
        timeout_s: float,
        done: Done,
        on_late: Late | None = None,
        layout: int = 0,
    ) -> None:
        """Send one batch; `done` gets its Reply or the exception that ended it. `layout`:
        the layout_id that placed every op on this node (0: none, or not one)."""
        loop = asyncio.get_running_loop()
        self._ids += 1
        call_id = self._ids
        payload = wire.frame(wire.Request(call_id, deadline_ms, ops, layout))
        call = _Call(done, loop.time() + timeout_s, on_late)
        self._calls[call_id] = call
        self._order.append(call_id)
        if self._timer is None:
            self._timer = loop.call_at(call.give_up_at, self._time_out)
        protocol = self._protocol
        if protocol is not None and not protocol.lost and protocol.transport is not None:
            protocol.transport.write(payload)
            return
        self._queued.append((call_id, payload))
        if self._connecting is None:
            self._connecting = loop.create_task(self._connect())

    async def _connect(self) -> None:
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                port = await self.discover(self.connect_timeout_s)
                tls = self.tls is not None
                protocol = await connect(lambda: _Protocol(self, tls), self.host, port, self.tls)
                assert protocol.transport is not None
                protocol.transport.write(wire.frame(wire.Hello(self.token)))
                self.welcome = await protocol.welcome
        except (OSError, TimeoutError) as exc:
            error: BaseException = exc
            if isinstance(exc, TimeoutError):
                error = TimeoutError(f"no channel to {self.url} within {self.connect_timeout_s} s")
            self._fail_queued(error)
            return
        finally:
            self._connecting = None
        self.connects += 1
        self._protocol = protocol
        queued, self._queued = self._queued, []
        assert protocol.transport is not None
        protocol.transport.write(b"".join(p for call_id, p in queued if call_id in self._calls))

    def _fail_queued(self, error: BaseException) -> None:
        queued, self._queued = self._queued, []
        for call_id, _ in queued:
            call = self._calls.pop(call_id, None)
            if call is not None and call.done is not None:
                _deliver(call.done, error)

    def _answered(self, reply: wire.Reply) -> None:
        call = self._calls.pop(reply.id, None)
        if call is None:
            return  # an id we never sent, or forgot when the connection was lost
        if call.done is not None:
            _deliver(call.done, reply)
        elif call.on_late is not None:
            try:
                call.on_late(reply)
            except Exception:
                log.exception("handling a late reply failed")

    def _lost(self, protocol: _Protocol, error: Exception) -> None:
        if protocol is not self._protocol:
            return  # a connection that never got to carry batches
        self._protocol = None
        calls, self._calls = self._calls, {}
        self._order.clear()
        # Batches queued for a connection not opened yet stay (they were never sent).
        for call_id, _ in self._queued:
            if call_id in calls:
                self._calls[call_id] = calls.pop(call_id)
                self._order.append(call_id)
        for call in calls.values():
            if call.done is not None:
                _deliver(call.done, error if isinstance(error, OSError) else OSError(str(error)))

    def _time_out(self) -> None:
        # One loop turn later: an answer already read from the socket in this turn (a
        # stall of this process) is handled first and wins over the timeout.
        self._timer = None
        asyncio.get_running_loop().call_soon(self._expire)

    def _expire(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        order, calls = self._order, self._calls
        while order:
            call = calls.get(order[0])
            if call is None or call.done is None:
                order.popleft()  # answered, or already timed out (and waiting late)
                continue
            if call.give_up_at > now:
                break
            call_id = order.popleft()
            done, call.done = call.done, None
            if call.on_late is None:
                del calls[call_id]
            _deliver(done, TimeoutError())
        if order and self._timer is None:
            head = calls.get(order[0])
            self._timer = loop.call_at(head.give_up_at if head else now, self._time_out)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._connecting is not None:
            self._connecting.cancel()
        if self._protocol is not None:
            self._protocol.close()
