"""A node's status: liveness, readiness (its Redis answers), Prometheus metrics, and
the stats the routers' epoch poll and `GET /v1/cluster` read."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from cluster.web.problem import json_response, problem
from node.edge.internal import STATE, internal
from node.health.redis_stats import redis_stats, rules_version, unready_because
from node.state import NodeState


@internal()
async def stats(request: web.Request, state: NodeState, body: Any) -> web.Response:
    """The node's stats; `?brief=1` (wire.EPOCH_STATS_PATH): only what a router's epoch
    poll follows, without Redis' INFO, whose reading and parsing twice a second showed
    in live checks' p99."""
    topology = state.topology
    answer: dict[str, Any] = {
        "node": state.node_id,
        "epoch": state.epoch,
        "live": state.liveness.port,
        "cluster_id": topology.cluster_id if topology else None,
        "partitioner": topology.partitioner.kind if topology else None,
    }
    if request.query.get("brief"):
        answer["rules_version"] = await rules_version(state.redis)
        return json_response(answer)
    answer |= {
        **await redis_stats(state.redis, state.failovers),
        "singleton": state.sweeper_lease.held,  # this endpoint sweeps the shard's holds
        "expired_batches": state.expired_batches,
        "undone_checks": state.undone_checks,
    }
    return json_response(answer)


async def healthz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    live, channel = state.liveness.port, state.channel_port
    return json_response({"status": "ok", "node": state.node_id, "live": live, "channel": channel})


async def metrics(request: web.Request) -> web.Response:
    """Prometheus exposition (node/health/metrics.py); no token, like /healthz."""
    body = await request.app[STATE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def readyz(request: web.Request) -> web.Response:
    """Ready while the shard's Redis answers and takes writes: a full one (noeviction) or
    one that cannot persist refuses every check that would consume."""
    state = request.app[STATE]
    refusing = await unready_because(state.redis)
    if refusing is not None:
        detail = f"node {state.node_id}'s Redis: {refusing}"
        return problem(503, "redis-refuses-writes", detail)
    return json_response({"status": "ready", "node": state.node_id, "epoch": state.epoch})
