"""aiohttp middleware: one shardlimit check per request of an aiohttp application.

    app = web.Application(middlewares=[rate_limit_middleware(
        client=AsyncClient("http://127.0.0.1:8080"),
        key=lambda request: request.remote or "unknown",
        rules={"login": "login", "/items/{id}": "items"},   # route name, pattern or path
        default_rule="basic",
        exempt=["/healthz"],
    )])

Denied: 429 problem+json with Retry-After and the RateLimit headers. Allowed: the handler's
response (or raised HTTPException) with the RateLimit headers added.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from cluster.sdk.client import AsyncClient
from cluster.sdk.failure import OnFailure
from cluster.sdk.http_guard import HttpGuard
from cluster.sdk.routes import RouteRules


def _route_names(request: web.Request) -> tuple[str, ...]:
    route = request.match_info.route
    names: list[str] = []
    if route.name:
        names.append(route.name)
    if route.resource is not None:
        names.append(route.resource.canonical)
    return tuple(names)


def rate_limit_middleware(
    *,
    client: AsyncClient,
    key: Callable[[web.Request], str],
    rules: Mapping[str, str] | None = None,
    default_rule: str | None = None,
    exempt: Iterable[str] = (),
    on_failure: OnFailure | None = None,
    cost: int = 1,
) -> Middleware:
    """A middleware limiting requests by `key(request)` under the route's rule."""
    routes = RouteRules(rules, default_rule, exempt)
    guard = HttpGuard(client, on_failure, cost=cost)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        rule = routes.rule_for(request.path, _route_names(request))
        if rule is None:
            return await handler(request)
        verdict = await guard.check(key(request), rule)
        if not verdict.allowed:
            return web.Response(
                status=429,
                body=verdict.denied_body(),
                headers=verdict.headers,
                content_type="application/problem+json",
            )
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            exc.headers.update(verdict.headers)
            raise
        if not response.prepared:
            response.headers.update(verdict.headers)
        return response

    return middleware
