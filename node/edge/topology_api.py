"""A node's topology: installed by the orchestrator (PUT), read back (GET), and taken
from a peer that sent a newer one along."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from cluster.model.topology import Topology
from cluster.web.problem import json_response, problem, read_json
from node.edge.internal import internal
from node.state import NodeState


def _parse_topology(data: Any) -> Topology | str:
    try:
        return Topology.from_dict(data if isinstance(data, dict) else {})
    except (ValueError, TypeError, KeyError) as exc:
        return str(exc)


def newer_topology(data: Any, epoch: int) -> Topology | None:
    """The topology a peer sent along, when it is valid and newer than `epoch`. Its epoch is
    looked at first: building a ring costs about a millisecond, paid on every first-touch
    pull if parsed each time, and a pull almost always carries the epoch we have."""
    sent = data.get("epoch") if isinstance(data, dict) else None
    if not isinstance(sent, int) or sent <= epoch:
        return None
    newer = _parse_topology(data)
    return newer if isinstance(newer, Topology) else None


@internal()
async def put_topology(request: web.Request, state: NodeState, body: Any) -> web.Response:
    body, error = await read_json(request)
    if error is not None:
        return error
    topology = _parse_topology(body)
    if isinstance(topology, str):
        return problem(400, "bad-topology", topology)
    refused = await state.kept.install(topology)
    if refused is not None:
        return problem(refused.status, refused.kind, refused.detail)
    if state.ownership is not None:
        state.migrator.sources.prepare(state.ownership)
    return json_response({"epoch": state.epoch})


@internal()
async def get_topology(request: web.Request, state: NodeState, body: Any) -> web.Response:
    if state.topology is None:
        return problem(404, "no-topology", "this node has no topology yet")
    return json_response(state.topology.to_dict())
