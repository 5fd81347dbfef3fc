"""A batch over HTTP (node/batch/runner.py): what the channel carries, for a caller
without it."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from cluster import wire
from cluster.web.problem import problem
from node.batch.runner import MAX_OPS, run_batch
from node.edge.internal import internal
from node.state import NodeState


def _reply(state: NodeState, results: list[wire.Result]) -> web.Response:
    reply = wire.BatchReply(state.epoch, state.node_id, state.liveness.port, results)
    return web.Response(body=wire.encode(reply), content_type=wire.CONTENT_TYPE)


@internal()
async def batch(request: web.Request, state: NodeState, body: Any) -> web.Response:
    """A batch over HTTP (node/batch/runner.py); routers send theirs on the channel."""
    try:
        message = wire.decode_batch(await request.read())
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return problem(400, "bad-batch", f"not a batch: {exc}")
    if len(message.ops) > MAX_OPS:
        return problem(413, "too-many-ops", f"at most {MAX_OPS} ops per batch")
    return _reply(state, await run_batch(state, message.deadline_ms, message.ops))
