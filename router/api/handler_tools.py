"""What every router handler uses: the Router behind the app and the admin-token guard
(JSON answers: cluster.web.problem.json_response, shared with the nodes)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

from aiohttp import web

from cluster.web.auth import bearer_matches
from cluster.web.problem import Problem
from router.service import Router

ROUTER: web.AppKey[Router] = web.AppKey("router")

Handler = Callable[[web.Request], Awaitable[web.Response]]


def router_of(request: web.Request) -> Router:
    return request.app[ROUTER]


def need_admin() -> Problem:
    return Problem(
        401,
        "unauthorized",
        "this endpoint needs the admin token: Authorization: Bearer <token>",
        headers={"WWW-Authenticate": 'Bearer realm="shardlimit-admin"'},
    )


def is_admin(request: web.Request) -> bool:
    return bearer_matches(request.headers.get("Authorization"), router_of(request).admin_token)


def admin_only(handler: Handler) -> Handler:
    """A handler that needs the admin token (a 401 problem without it)."""

    @functools.wraps(handler)
    async def guarded(request: web.Request) -> web.Response:
        if not is_admin(request):
            raise need_admin()
        return await handler(request)

    return guarded
