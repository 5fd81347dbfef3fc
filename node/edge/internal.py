"""The node's HTTP endpoints for routers and peers: the cluster token first, then the
body decoded into its control message (cluster/wire/control.py)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from cluster import wire
from cluster.web.auth import bearer_matches
from cluster.web.problem import problem
from node.state import NodeState

STATE: web.AppKey[NodeState] = web.AppKey("state")
Handler = Callable[[web.Request], Awaitable[web.Response]]
InternalHandler = Callable[[web.Request, NodeState, Any], Awaitable[web.Response]]


def _authorized(request: web.Request) -> bool:
    state = request.app[STATE]
    return bearer_matches(request.headers.get("Authorization"), state.cluster_token)


def internal(
    body: type[wire.Control] | None = None, *, slug: str = "bad-request"
) -> Callable[[InternalHandler], Handler]:
    """Node endpoints: cluster token first, then the body decoded into its control
    message (cluster/wire/control.py); one that does not fit is a 400 `slug` naming the field."""

    def wrap(handler: InternalHandler) -> Handler:
        @functools.wraps(handler)
        async def endpoint(request: web.Request) -> web.Response:
            if not _authorized(request):
                return problem(401, "unauthorized", "cluster token required")
            message: Any = None
            if body is not None:
                try:
                    message = msgspec.json.decode(await request.read(), type=body)
                except (msgspec.ValidationError, *wire.DECODE_ERRORS) as exc:
                    return problem(400, slug, str(exc))
            return await handler(request, request.app[STATE], message)

        return endpoint

    return wrap
