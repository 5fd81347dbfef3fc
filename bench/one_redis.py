"""A second baseline for the open-loop latency piece: the same decision in ONE process
over ONE Redis, the design shardlimit replaces ("one Redis with Lua").

An aiohttp handler (uvloop, `cluster.web.serve.run_app`, like the router) parses the same
`POST /v1/check` body the router gets, runs the node's own counter store on it (the same
batch.lua and the same lean RESP pipe, `node.store.counter_store`) against one
redis-server with the cluster's persistence (AOF, fsync every second), and answers the
decision. What it lacks is only what shardlimit adds: the router, the node hop, routing.
So the router ÷ this baseline is what distribution costs a check, and this baseline ÷
the trivial handler is what one Redis round trip costs on this machine.

    python -m bench.one_redis --port P --redis redis://127.0.0.1:R/0
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

import orjson
from aiohttp import web

from bench.cpu import ONE_REDIS_HOST
from bench.peers import bare_redis, handler_process, healthz
from cluster import wire
from cluster.model.errors import Problems
from cluster.model.keys import INLINE_SCOPE
from cluster.model.limits import parse_limits
from cluster.web.problem import invalid, problem
from node.batch.ops import parse_op
from node.errors import BadOp
from node.store.connect import redis_client
from node.store.counter_store import CounterStore
from node.store.replies import check_result


def _bad(detail: str) -> web.Response:
    return problem(400, "validation", detail)


def one_redis_app(redis_url: str) -> web.Application:
    store = CounterStore(redis_client(redis_url, socket_connect_timeout=2.0, socket_timeout=None))

    async def check(request: web.Request) -> web.Response:
        try:
            body: Any = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _bad("the body is not JSON")
        if not isinstance(body, dict) or not isinstance(body.get("key"), str):
            return _bad("key must be a string")
        problems = Problems()
        limits = parse_limits(body.get("limits"), "limits", problems)
        if problems.errors:
            return invalid(problems.errors).response()
        specs = [spec.to_wire() for spec in limits]
        try:
            op = parse_op(
                wire.Op("check", body["key"], INLINE_SCOPE, specs, [0] * len(specs), cost=1)
            )
        except BadOp as exc:
            return _bad(str(exc))
        (out,) = await store.run([op])
        decision = check_result(out)
        if not isinstance(decision, wire.Checked):
            raise web.HTTPServiceUnavailable(text=f"unexpected reply {decision!r}")
        answer = {"allowed": decision.allowed, "key": body["key"], "degraded": False}
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/check", check)
    app.router.add_get("/healthz", healthz)
    return app


@contextlib.contextmanager
def one_redis_server() -> Iterator[str]:
    """The baseline's redis-server and handler process, on free ports; yields its URL."""
    with (
        bare_redis(aof=True, host=ONE_REDIS_HOST) as server,
        handler_process("one-Redis aiohttp", "bench.one_redis", "--redis", server.url) as url,
    ):
        yield url


def main() -> None:
    from cluster.web.serve import run_app

    parser = argparse.ArgumentParser(description="one aiohttp process deciding over one Redis")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--redis", required=True, help="redis://host:port/db")
    args = parser.parse_args()
    run_app(one_redis_app(args.redis), args.host, args.port)


if __name__ == "__main__":
    main()
