"""The node's one Redis-error boundary: any handler's Redis failure becomes a 503.

Handlers let RedisError / OSError propagate; this middleware answers them with
`redis-unavailable`, or `redis-refuses-writes` when Redis refused a write (full, or
unable to persist), saying why (routers mark the node down on a 503 and probe its
readiness until Redis answers again). After a connection error the idle pooled
connections are dead too: they are dropped now, or each would fail one more request
after Redis is back. The channel answers a batch's Redis failure the same way
(`redis_failure`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.typedefs import Middleware
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from cluster.web.problem import problem
from node.edge.internal import STATE
from node.store.reply_errors import write_refusal

__all__ = ["redis_boundary", "redis_failure"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def redis_failure(node_id: str, error: BaseException) -> tuple[str, str]:
    """The problem's slug and detail for a Redis failure of this node."""
    refusal = write_refusal(error)
    if refusal is not None:
        return "redis-refuses-writes", f"node {node_id}'s Redis {refusal}: it refused the write"
    return "redis-unavailable", f"node redis unavailable: {error}"


def redis_boundary(*clients: aioredis.Redis) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except (RedisError, OSError) as exc:
            if isinstance(exc, RedisConnectionError | OSError):
                for client in clients:
                    await client.connection_pool.disconnect(inuse_connections=False)
            return problem(503, *redis_failure(request.app[STATE].node_id, exc))

    return middleware
