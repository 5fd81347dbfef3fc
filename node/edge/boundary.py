"""The node's one Redis-error boundary: any handler's Redis failure becomes a 503.

Handlers let RedisError / OSError propagate; this middleware answers them with
`redis-unavailable` (routers mark the node down on a 503 and probe its readiness
until Redis answers again). After a connection error the idle pooled connections
are dead too: they are dropped now, or each would fail one more request after
Redis is back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.typedefs import Middleware
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from cluster.web.problem import problem

__all__ = ["redis_boundary"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def redis_boundary(*clients: aioredis.Redis) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except (RedisError, OSError) as exc:
            if isinstance(exc, RedisConnectionError | OSError):
                for client in clients:
                    await client.connection_pool.disconnect(inuse_connections=False)
            return problem(503, "redis-unavailable", f"node redis unavailable: {exc}")

    return middleware
