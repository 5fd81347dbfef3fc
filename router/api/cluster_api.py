"""The cluster seen from a router: its nodes and migration (`GET /v1/cluster`), the
layout's ring or slots, where a key lives, and the live page /ui."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from cluster.model.errors import Problems
from cluster.web.problem import Problem, json_response
from router.api.handler_tools import query_of, router_of
from router.api.ring_view import RingView
from router.api.ui import HEADERS as UI_HEADERS
from router.api.ui import asset as ui_asset
from router.requests import parse_key

# The layout behind GET /v1/cluster/ring, encoded once per topology epoch.
RING_VIEW: web.AppKey[RingView] = web.AppKey("ring_view")


async def get_cluster(request: web.Request) -> web.Response:
    view = router_of(request).view
    stats = await view.node_stats()
    shares = view.topology.partitioner.shares()
    nodes: list[dict[str, Any]] = []
    specs = {n.id: n for n in (*view.previous_nodes(), *view.topology.nodes)}
    for spec in specs.values():
        client = view.clients[spec.id]
        node_stats = stats.get(spec.id, {})
        nodes.append(
            {
                "id": spec.id,
                "url": spec.url,
                "weight": spec.weight,
                "state": "down" if "error" in node_stats else client.state,
                "endpoints": client.endpoint_states(),
                "keys": node_stats.get("keys"),
                "memory_bytes": node_stats.get("memory"),
                "redis_problem": node_stats.get("redis_problem"),
                "node_epoch": node_stats.get("epoch"),
                "redis": node_stats.get("replication"),
                "share": round(shares.get(spec.id, 0.0), 6),
                "ops_routed": client.ops,
                "node_requests": client.requests,
                "last_error": client.last_error,
            }
        )
    total_ops = sum(view.clients[spec_id].ops for spec_id in specs) or 1
    for node in nodes:
        node["load_share"] = round(view.clients[node["id"]].ops / total_ops, 6)
    return json_response(
        {
            "epoch": view.topology.epoch,
            "partitioner": view.topology.partitioner.kind,
            "nodes": nodes,
            "migration": router_of(request).resharder.status(),
        }
    )


async def get_cluster_ring(request: web.Request) -> web.Response:
    """Ring points or slot ranges of the current layout (router/api/ring_view.py), for /ui."""
    body = request.app[RING_VIEW].body(router_of(request).view.topology)
    return web.Response(body=body, content_type="application/json")


async def get_ui(request: web.Request) -> web.Response:
    """The live cluster page (router/api/ui/): /ui, and its files under /ui/."""
    if request.path == "/ui/":
        raise web.HTTPFound("/ui")
    found = ui_asset(request.match_info.get("name", "index.html"))
    if found is None:
        raise Problem(404, "not-found", f"no file {request.path}")
    body, content_type = found
    return web.Response(body=body, content_type=content_type, charset="utf-8", headers=UI_HEADERS)


async def get_locate(request: web.Request) -> web.Response:
    problems = Problems()
    key = parse_key(query_of(request).get("key"), "key", problems)
    problems.raise_if_any()
    located = router_of(request).view.topology.partitioner.locate(key)
    return json_response({"key": key, **located})
