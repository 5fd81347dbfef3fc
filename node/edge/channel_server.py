"""The hot-path channel: routers' batches as frames on one long-lived connection each.

A plain asyncio protocol on a port of its own (announced as `channel` in /healthz),
so a batch costs no HTTP request machinery: frame in, one Redis pipeline out (node/
batch/runner.py), frame back. Frames are defined in cluster/wire/channel.py. Replies go out as
their batches finish, so they may overtake each other. The first frame must be a
`Hello` with the cluster token; anything else is refused and the connection closed.
The listener speaks TLS (mutual TLS included) with the node's own server context.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import ssl
from typing import cast

import msgspec
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from cluster import wire
from cluster.web.serve import CannotListenError
from node.batch.runner import MAX_OPS, start_batch
from node.edge.boundary import redis_failure
from node.state import NodeState

__all__ = ["ChannelServer"]

log = logging.getLogger("shardlimit.node")
# Batches running for one connection before this node stops reading from it (the
# router bounds its own in-flight batches far below; this guards against any other).
MAX_RUNNING = 256
# How long a connection may take to send its Hello (a router sends it at once); a
# connection that has not by then is closed, so that no unauthenticated one stays open.
HELLO_WAIT_S = 10.0


def _token_matches(given: str | None, expected: str | None) -> bool:
    if expected is None:
        return True
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


class _Peer(asyncio.Protocol):
    """One router's connection."""

    def __init__(self, server: ChannelServer) -> None:
        self.server = server
        self.state = server.state
        self.transport: asyncio.Transport | None = None
        # What a client without the token can make this node hold: one Hello-sized frame.
        self.frames = wire.FrameBuffer(first_max_bytes=wire.MAX_HELLO_BYTES)
        self.welcomed = False
        self.running = 0  # batches started and not answered
        self.paused = False
        self.hello_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; same interface.
        self.transport = cast(asyncio.Transport, transport)
        self.server.peers.add(self)
        loop = asyncio.get_running_loop()
        self.hello_timer = loop.call_later(HELLO_WAIT_S, self._no_hello)

    def _no_hello(self) -> None:
        if not self.welcomed:
            self._refuse(f"no hello within {HELLO_WAIT_S:g} s")

    def connection_lost(self, exc: Exception | None) -> None:
        # Batches already running finish (Redis applies them either way); their
        # replies have nowhere to go, and the router takes such checks back.
        self.server.peers.discard(self)
        if self.hello_timer is not None:
            self.hello_timer.cancel()

    def _write(self, message: wire.ChannelOut) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(wire.frame(message))

    def _refuse(self, detail: str) -> None:
        self._write(wire.Refused(detail))
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        try:
            bodies = self.frames.feed(data)
        except ValueError as exc:
            self._refuse(str(exc))
            return
        pipe = self.state.store.lean_pipe if len(bodies) > 1 else None
        if pipe is None:
            self._messages(bodies)
            return
        pipe.cork()
        try:
            self._messages(bodies)
        finally:
            pipe.uncork()

    def _messages(self, bodies: list[bytes]) -> None:
        for body in bodies:
            try:
                message = wire.decode_channel_in(body)
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                self._refuse(f"not a channel frame: {exc}")
                return
            if isinstance(message, wire.Request) and self.welcomed:
                self._start(message)
            elif isinstance(message, wire.Hello) and not self.welcomed:
                if not _token_matches(message.token, self.state.cluster_token):
                    self._refuse("cluster token required")
                    return
                self.welcomed = True
                if self.hello_timer is not None:
                    self.hello_timer.cancel()
                state = self.state
                self._write(wire.Welcome(state.node_id, state.epoch, state.liveness.port))
            else:
                self._refuse("a channel opens with one hello, then carries batches")
                return

    def _start(self, request: wire.Request) -> None:
        if len(request.ops) > MAX_OPS:
            self._write(wire.Reply(request.id, 413, detail=f"at most {MAX_OPS} ops per batch"))
            return
        self.running += 1
        if self.running >= MAX_RUNNING and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        request_id = request.id

        def answer(outcome: list[wire.Result] | BaseException) -> None:
            self._answer(request_id, outcome)

        try:
            start_batch(self.state, request.deadline_ms, request.ops, answer, request.layout)
        except Exception as exc:  # raised before any callback was registered
            answer(exc)

    def _answer(self, request_id: int, outcome: list[wire.Result] | BaseException) -> None:
        self.running -= 1
        if self.paused and self.running < MAX_RUNNING // 2 and self.transport is not None:
            self.paused = False
            if not self.transport.is_closing():
                self.transport.resume_reading()
        state = self.state
        if not isinstance(outcome, BaseException):
            reply = wire.BatchReply(state.epoch, state.node_id, state.liveness.port, outcome)
            self._write(wire.Reply(request_id, 200, reply))
        elif isinstance(outcome, RedisError | OSError):
            if isinstance(outcome, RedisConnectionError | OSError):
                # Idle pooled connections are dead too (as node/edge/boundary.py does).
                self.server.drop_idle_redis_connections()
            _slug, detail = redis_failure(state.node_id, outcome)
            self._write(wire.Reply(request_id, 503, detail=detail))
        else:  # a bug: answer it, keep serving the connection
            log.error("batch failed", exc_info=outcome)
            detail = f"{type(outcome).__name__}: {outcome}"
            self._write(wire.Reply(request_id, 500, detail=detail))


class ChannelServer:
    def __init__(
        self, state: NodeState, host: str, ssl_context: ssl.SSLContext | None, port: int = 0
    ) -> None:
        self.state = state
        self.host = host
        self.ssl_context = ssl_context
        self.port = port
        self.peers: set[_Peer] = set()
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def drop_idle_redis_connections(self) -> None:
        task = asyncio.get_running_loop().create_task(self._drop_idle())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drop_idle(self) -> None:
        for client in (self.state.redis, self.state.counters):
            await client.connection_pool.disconnect(inuse_connections=False)

    async def start(self) -> int:
        """Listen; the port (an ephemeral one unless given)."""
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                lambda: _Peer(self), self.host, self.port, ssl=self.ssl_context
            )
        except OSError as exc:
            where = f"{self.host}:{self.port}"
            raise CannotListenError(f"cannot listen on {where} (channel): {exc}") from exc
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for peer in list(self.peers):
            if peer.transport is not None:
                peer.transport.close()
        if self._server is not None:
            await self._server.wait_closed()
