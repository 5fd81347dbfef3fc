"""What the cluster keeps on its nodes: the versioned rules document, the change leases
(on the lock node), and, in test mode, the scripts' clock offset."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from cluster import wire
from cluster.model.keys import LEASES, RULES_KEY, lease_key
from cluster.web.problem import json_response, problem
from node.edge.internal import internal
from node.state import NodeState


@internal()
async def get_rules(request: web.Request, state: NodeState, body: Any) -> web.Response:
    """The cluster's rules document as this node holds it (version 0: none yet)."""
    version, doc = await state.redis.hmget(RULES_KEY, ["version", "doc"])
    return json_response({"version": int(version or 0), "rules": orjson.loads(doc) if doc else {}})


@internal(wire.RulesDocument, slug="bad-rules")
async def put_rules(
    request: web.Request, state: NodeState, body: wire.RulesDocument
) -> web.Response:
    """Store a rules document if its version is newer than the one held. The router
    validated it; it is kept as given (JSON) and served back as is."""
    stored, held = await state.rules_script(
        keys=[RULES_KEY], args=[body.version, orjson.dumps(body.rules).decode()]
    )
    return json_response({"stored": stored == 1, "version": held})


@internal(wire.ClockOffset, slug="bad-offset")
async def set_clock(request: web.Request, state: NodeState, body: wire.ClockOffset) -> web.Response:
    """Test mode only: shift the clock every script sees."""
    if not state.test_mode:
        return problem(404, "not-found", "not found")
    state.store.offset_ms = body.offset_ms
    return json_response({"offset_ms": body.offset_ms})


@internal(wire.Lease, slug="bad-lease")
async def lease(request: web.Request, state: NodeState, body: wire.Lease) -> web.Response:
    """A change lease, `name` "topology" (the default) or "rules", held in this node's
    Redis when it is the lock node."""
    if body.name not in LEASES:
        return problem(400, "bad-lease", f"name must be one of: {', '.join(LEASES)}")
    held = await state.lease_script(
        keys=[lease_key(body.name)], args=[body.action, body.token, body.ttl_ms]
    )
    return json_response({"held": held == 1})
