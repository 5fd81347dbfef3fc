"""A router's status: liveness, readiness (every node answers its own), Prometheus
metrics, and the OpenAPI document."""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from cluster.web.problem import json_response
from router.api.handler_tools import router_of
from router.api.openapi import openapi_document
from router.errors import NodeUnavailable


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    view = router_of(request).view

    async def probe(node_id: str) -> tuple[str, str | None]:
        """The node and why it is not ready (None: it is)."""
        try:
            await view.clients[node_id].get("/readyz", timeout_s=0.5)
        except NodeUnavailable as exc:
            return node_id, str(exc)
        return node_id, None

    unready = dict(await asyncio.gather(*(probe(n) for n in view.clients)))
    down = {n: why for n, why in sorted(unready.items()) if why is not None}
    body = {
        "status": "degraded" if down else "ready",
        "epoch": view.topology.epoch,
        "nodes": {n: ("down" if n in down else "up") for n in sorted(unready)},
    }
    if down:
        body["why"] = down  # a node's own readiness answer: unreachable, or its Redis
    return json_response(body, status=503 if down else 200)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus exposition; no token, like /healthz: no label carries a limit key."""
    return web.Response(
        body=router_of(request).render_metrics(),
        headers={"Content-Type": CONTENT_TYPE_LATEST, "X-Content-Type-Options": "nosniff"},
    )


async def get_openapi(request: web.Request) -> web.Response:
    return json_response(openapi_document())
