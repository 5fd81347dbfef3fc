"""The lean gRPC listener: ShouldRateLimit and grpc.health.v1.Health over the HTTP/2
connections of router/envoy/h2.py, on the router's event loop.

grpcio's asyncio server costs more CPU per call than the router's whole HTTP check
path (bench/README.md, "The gRPC path"): its completion queue is polled by a thread
that wakes the event loop for every event of every call. This listener runs the same
handlers (`RateLimitService.ShouldRateLimit`, grpcio-health-checking's HealthServicer
`Check` and `Watch`) with a context that answers on the HTTP/2 stream, so the answers,
status codes and messages are those of the grpcio server. It serves plaintext; with a
certificate the router keeps grpcio's server (router/envoy/server.py).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from envoy.service.ratelimit.v3 import rls_pb2  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from grpc_health.v1 import health_pb2  # type: ignore[import-untyped]

from cluster.web.serve import CannotListenError
from router.envoy import h2_frames as f
from router.envoy.h2 import H2Connection

log = logging.getLogger("shardlimit.envoy")

RATE_LIMIT_PATH = b"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
HEALTH_CHECK_PATH = b"/grpc.health.v1.Health/Check"
HEALTH_WATCH_PATH = b"/grpc.health.v1.Health/Watch"
AGE_JITTER = 0.1  # as grpc core: the age is spread by +-10% so connections do not all go at once


class _Aborted(Exception):
    """context.abort: the status is sent; the handler unwinds."""


class StreamContext:
    """The part of grpc.aio.ServicerContext the handlers use, answering on one stream."""

    __slots__ = ("connection", "stream_id")

    def __init__(self, connection: H2Connection, stream_id: int) -> None:
        self.connection = connection
        self.stream_id = stream_id

    async def abort(self, code: Any, details: str = "") -> None:
        self.connection.finish(self.stream_id, int(code.value[0]), details)
        raise _Aborted

    async def write(self, message: Any) -> None:
        self.connection.send_message(self.stream_id, message.SerializeToString())


Handler = Callable[[Any, Any], Awaitable[Any]]


class LeanGrpcServer:
    """The listening socket, its connections, and which handler answers which path."""

    def __init__(
        self, host: str, port: int | None, servicer: Any, health: Any, age_ms: int, grace_ms: int
    ) -> None:
        self.host = host
        self.port = port
        self.age_s = age_ms / 1000
        self.grace_s = grace_ms / 1000
        self.methods: dict[bytes, tuple[Any, Handler, bool]] = {
            RATE_LIMIT_PATH: (rls_pb2.RateLimitRequest, servicer.ShouldRateLimit, False),
            HEALTH_CHECK_PATH: (health_pb2.HealthCheckRequest, health.Check, False),
            HEALTH_WATCH_PATH: (health_pb2.HealthCheckRequest, health.Watch, True),
        }
        self.connections: set[H2Connection] = set()
        self._server: asyncio.Server | None = None
        self._gone = asyncio.Event()

    def connection(self) -> H2Connection:
        connection = H2Connection(self, self._forget)
        self.connections.add(connection)
        if self.age_s > 0:
            age = self.age_s * (1 + random.uniform(-AGE_JITTER, AGE_JITTER))
            timer = asyncio.get_running_loop().call_later(age, connection.go_away, self.grace_s)
            connection.timers.append(timer)
        return connection

    def _forget(self, connection: H2Connection) -> None:
        self.connections.discard(connection)
        if not self.connections:
            self._gone.set()

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                self.connection, self.host, self.port or 0, reuse_address=True
            )
        except OSError as exc:
            raise CannotListenError(
                f"cannot listen on {self.host}:{self.port} (gRPC): {exc}"
            ) from exc
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, grace_s: float) -> None:
        """No new connections; calls in flight get `grace_s` to finish."""
        if self._server is None:
            return
        self._server.close()
        self._server = None
        if self.connections:
            self._gone.clear()
            for connection in list(self.connections):
                connection.go_away(grace_s)
            try:
                await asyncio.wait_for(self._gone.wait(), grace_s + 0.1)
            except TimeoutError:
                for connection in list(self.connections):
                    connection.abort()

    # Calls (router/envoy/h2.py)

    def call(
        self, connection: H2Connection, stream_id: int, path: bytes, message: bytes
    ) -> asyncio.Task[None] | None:
        method = self.methods.get(path)
        if method is None:
            connection.finish(stream_id, f.GRPC_UNIMPLEMENTED, "Method not found!")
            return None
        kind, handler, streaming = method
        try:
            request = kind.FromString(message)
        except DecodeError:
            connection.finish(stream_id, f.GRPC_INTERNAL, "Exception deserializing request!")
            return None
        return asyncio.get_running_loop().create_task(
            self._run(connection, stream_id, handler, request, streaming)
        )

    async def _run(
        self,
        connection: H2Connection,
        stream_id: int,
        handler: Handler,
        request: Any,
        streaming: bool,
    ) -> None:
        """A unary handler's answer is its one message; a streaming handler has written its
        messages through the context and the call ends with OK."""
        try:
            response = await handler(request, StreamContext(connection, stream_id))
        except _Aborted:
            return
        except Exception as exc:
            log.exception("gRPC handler failed")
            connection.finish(stream_id, f.GRPC_UNKNOWN, f"Unexpected {type(exc)}: {exc}")
            return
        if streaming:
            connection.finish(stream_id, f.GRPC_OK)
        else:
            connection.respond(stream_id, response.SerializeToString())
