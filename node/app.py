"""The counter node: an aiohttp app in front of one Redis."""

from __future__ import annotations

import logging
from typing import Any

import orjson
import redis.asyncio as aioredis
from aiohttp import web
from redis.exceptions import RedisError

from cluster.auth import bearer_matches
from cluster.problem import problem, problem_middleware, read_json
from cluster.topology import Topology
from node.ops import BadOp, Op, parse_op
from node.store import CounterStore, check_result, refund_result

log = logging.getLogger("shardlimit.node")
MAX_BODY = 16 * 1024 * 1024
MAX_OPS = 10_000

STATE: web.AppKey[NodeState] = web.AppKey("state")


class NodeState:
    def __init__(
        self,
        node_id: str,
        redis_url: str,
        cluster_token: str | None,
        *,
        test_mode: bool = False,
    ) -> None:
        self.node_id = node_id
        self.cluster_token = cluster_token
        self.test_mode = test_mode
        self.redis = aioredis.from_url(
            redis_url, socket_connect_timeout=0.25, socket_timeout=1.0, max_connections=64
        )
        self.store = CounterStore(self.redis)
        self.topology: Topology | None = None

    @property
    def epoch(self) -> int:
        return self.topology.epoch if self.topology else 0

    def owns(self, key: str) -> bool:
        return self.topology is not None and self.topology.partitioner.owner(key) == self.node_id


def _authorized(request: web.Request) -> bool:
    state = request.app[STATE]
    return bearer_matches(request.headers.get("Authorization"), state.cluster_token)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


async def batch(request: web.Request) -> web.Response:
    """Run many operations in one Redis pipeline. Ops for keys we do not own: `moved`."""
    state = request.app[STATE]
    if not _authorized(request):
        return problem(401, "unauthorized", "cluster token required")
    body, error = await read_json(request)
    if error is not None:
        return error
    if not isinstance(body, dict) or not isinstance(body.get("ops"), list):
        return problem(400, "bad-batch", "body must be an object with an 'ops' list")
    raw_ops: list[Any] = body["ops"]
    if len(raw_ops) > MAX_OPS:
        return problem(413, "too-many-ops", f"at most {MAX_OPS} ops per batch")
    results: list[Any] = [None] * len(raw_ops)
    runnable: list[Op] = []
    slots: list[int] = []
    for index, raw in enumerate(raw_ops):
        try:
            op = parse_op(raw)
        except BadOp as exc:
            results[index] = {"s": "error", "detail": str(exc)}
            continue
        if not state.owns(op.key):
            results[index] = {"s": "moved"}
            continue
        runnable.append(op)
        slots.append(index)
    if runnable:
        try:
            outputs = await state.store.run(runnable)
        except (RedisError, OSError) as exc:
            return problem(503, "redis-unavailable", f"node redis unavailable: {exc}")
        for index, op, out in zip(slots, runnable, outputs, strict=True):
            if isinstance(out, Exception):
                results[index] = {"s": "error", "detail": str(out)}
            elif op.kind == "check":
                results[index] = check_result(out)
            else:
                results[index] = refund_result(out)
    return _json({"epoch": state.epoch, "node": state.node_id, "results": results})


async def put_topology(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if not _authorized(request):
        return problem(401, "unauthorized", "cluster token required")
    body, error = await read_json(request)
    if error is not None:
        return error
    try:
        topology = Topology.from_dict(body if isinstance(body, dict) else {})
    except (ValueError, TypeError, KeyError) as exc:
        return problem(400, "bad-topology", str(exc))
    if topology.node(state.node_id) is None:
        return problem(409, "not-a-member", f"topology does not contain node {state.node_id}")
    if state.topology is not None and topology.epoch < state.topology.epoch:
        return problem(409, "stale-epoch", f"have epoch {state.topology.epoch}")
    state.topology = topology
    return _json({"epoch": state.epoch})


async def stats(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if not _authorized(request):
        return problem(401, "unauthorized", "cluster token required")
    try:
        keys = await state.redis.dbsize()
        memory = (await state.redis.info("memory"))["used_memory"]
    except (RedisError, OSError) as exc:
        return problem(503, "redis-unavailable", f"node redis unavailable: {exc}")
    return _json({"node": state.node_id, "epoch": state.epoch, "keys": keys, "memory": memory})


async def set_clock(request: web.Request) -> web.Response:
    """Test mode only: shift the clock every script sees."""
    state = request.app[STATE]
    if not state.test_mode:
        return problem(404, "not-found", "not found")
    if not _authorized(request):
        return problem(401, "unauthorized", "cluster token required")
    body, error = await read_json(request)
    if error is not None:
        return error
    offset = body.get("offset_ms") if isinstance(body, dict) else None
    if not isinstance(offset, int) or isinstance(offset, bool):
        return problem(400, "bad-offset", "offset_ms must be an integer")
    state.store.offset_ms = offset
    return _json({"offset_ms": offset})


async def healthz(request: web.Request) -> web.Response:
    return _json({"status": "ok", "node": request.app[STATE].node_id})


async def readyz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        await state.redis.ping()
    except (RedisError, OSError) as exc:
        return problem(503, "redis-unavailable", f"node redis unavailable: {exc}")
    return _json({"status": "ready", "node": state.node_id, "epoch": state.epoch})


async def _on_startup(app: web.Application) -> None:
    state = app[STATE]
    try:
        await state.store.measure_skew()
    except (RedisError, OSError):
        log.warning("redis not reachable at start-up; clock skew assumed 0")


async def _on_cleanup(app: web.Application) -> None:
    await app[STATE].redis.aclose()


def create_app(
    node_id: str, redis_url: str, cluster_token: str | None, *, test_mode: bool = False
) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY, middlewares=[problem_middleware])
    app[STATE] = NodeState(node_id, redis_url, cluster_token, test_mode=test_mode)
    app.router.add_post("/node/v1/batch", batch)
    app.router.add_put("/node/v1/topology", put_topology)
    app.router.add_get("/node/v1/stats", stats)
    app.router.add_post("/node/v1/test/clock", set_clock)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.on_startup.append(_on_startup)
    app.on_cleanup.append(_on_cleanup)
    return app
