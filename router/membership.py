"""Admin handlers that change the cluster's membership: add or remove a node, resume a
migration. The migration itself is router/resharding.py."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from cluster import wire
from cluster.model.errors import FieldError
from cluster.model.nodes import NodeSpec
from cluster.web.problem import Problem, invalid, json_body
from router.cluster_view import ClusterView
from router.dispatch import NodeUnavailable
from router.handler_tools import admin_only, json_response, router_of
from router.requests import new_node
from router.service import Router

NODE_PROBE_S = 2.0  # how long a node being added has to answer its readiness probe


@admin_only
async def add_node(request: web.Request) -> web.Response:
    router = router_of(request)
    body = await json_body(request)
    nodes = list(router.view.topology.nodes)
    spec = new_node(body, {n.id for n in nodes})
    if router.config.tls_ca is not None and not spec.url.startswith("https://"):
        raise invalid(
            [
                FieldError(
                    "url",
                    "must be https://: this router verifies nodes' certificates (router.tls_ca)",
                )
            ]
        )
    dry_run = bool(body.get("dry_run", False))
    if not dry_run:
        await _require_reachable(router.view, spec)
    return await _reshard(router, [*nodes, spec], dry_run)


async def _require_reachable(view: ClusterView, spec: NodeSpec) -> None:
    """Refuse a node about to be added that cannot serve, before any lease or topology
    change: a refused connection, a failed TLS handshake (a certificate not from the
    cluster's CA, a client certificate refused), no answer, or a node whose Redis does
    not answer. Raises Problem."""
    try:
        channel = view.channel_for(spec)  # a channel of its own: not a member yet
    except ValueError as exc:
        raise invalid([FieldError("url", str(exc))]) from None
    try:
        await channel.get(wire.READY_PATH, timeout_s=NODE_PROBE_S)
    except NodeUnavailable as exc:
        raise Problem(
            503,
            "node-unreachable",
            f"node {spec.id} at {spec.url} did not answer {wire.READY_PATH}: {exc}; "
            "nothing was changed",
        ) from None
    finally:
        await channel.close()


@admin_only
async def remove_node(request: web.Request) -> web.Response:
    router = router_of(request)
    node_id = request.match_info["id"]
    nodes = list(router.view.topology.nodes)
    if node_id not in {n.id for n in nodes}:
        raise Problem(404, "unknown-node", f"no node {node_id} in the topology")
    if len(nodes) == 1:
        raise Problem(409, "last-node", "cannot remove the last node")
    dry_run = request.query.get("dry_run") in ("1", "true")
    return await _reshard(router, [n for n in nodes if n.id != node_id], dry_run)


async def _reshard(router: Router, nodes: list[NodeSpec], dry_run: bool) -> web.Response:
    try:
        new, moves = router.resharder.plan(nodes)
    except ValueError as exc:
        raise Problem(400, "bad-layout", str(exc)) from None
    if dry_run:
        body: dict[str, Any] = {
            "dry_run": True,
            "moves": moves,
            "shares": new.shares(),
            "partitioner": new.kind,
        }
        return json_response(body)
    return json_response(await router.resharder.start(nodes), status=202)


@admin_only
async def resume_migration(request: web.Request) -> web.Response:
    return json_response(router_of(request).resharder.resume(), status=202)
