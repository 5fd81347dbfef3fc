"""All-or-nothing batches across nodes: the coordinator's decision records, their hand
over when it leaves, and holds settled or adopted where their key moved."""

from __future__ import annotations

from aiohttp import web

from cluster import wire
from cluster.web.problem import json_response, problem
from node.batch.runner import MAX_OPS
from node.edge.internal import internal
from node.errors import PeerError
from node.holds.coordinator_records import parse_entries
from node.state import NodeState


@internal(wire.Decision, slug="bad-decision")
async def decide(request: web.Request, state: NodeState, body: wire.Decision) -> web.Response:
    """This node coordinates an all-or-nothing batch: record its decision, first wins.

    {"batch", "decision", "holds"?}: record (holds: the ids of the batch's holds; a
    "commit" naming them lasts until they are all settled); {"batch", "settled"}:
    those holds are settled (a node's sweeper reports them)."""
    batch, settled = body.batch, body.settled
    holds = settled if settled is not None else body.holds
    if len(holds) > MAX_OPS:
        return problem(413, "too-many-holds", f"at most {MAX_OPS} holds")
    if settled is not None:
        left = await state.store.settled(batch, holds)
        if left < 0:
            return _handed_over(state)
        return json_response({"batch": batch, "unsettled": left})
    wanted = body.decision
    if wanted is None:
        return problem(400, "bad-decision", "decision must be 'commit' or 'abort'")
    stored = await state.store.decide(batch, wanted, holds)
    if stored == "fenced":
        return _handed_over(state)
    return json_response({"batch": batch, "decision": stored})


def _handed_over(state: NodeState) -> web.Response:
    return problem(
        409,
        "decisions-handed-over",
        f"node {state.node_id} left the cluster and handed its decision records "
        "to its successor (see the topology's successors)",
    )


@internal(wire.DecisionsHandover, slug="bad-handover")
async def hand_over_decisions(
    request: web.Request, state: NodeState, body: wire.DecisionsHandover
) -> web.Response:
    """This node leaves the cluster: fence its decisions, give its records to `heir`."""
    heir, url = body.heir, body.url
    try:
        handed = await state.records.hand_over(heir, url.rstrip("/"))
    except PeerError as exc:
        return problem(503, "peer-unavailable", f"{heir} did not take the records: {exc}")
    return json_response({"handed": handed, "heir": heir})


@internal(wire.Entries, slug="bad-decisions")
async def adopt_decisions(
    request: web.Request, state: NodeState, body: wire.Entries
) -> web.Response:
    entries = parse_entries(body.entries)
    if isinstance(entries, str):
        return problem(400, "bad-decisions", entries)
    return json_response({"adopted": await state.records.adopt(entries)})


@internal(wire.Holds, slug="bad-holds")
async def settle_holds(request: web.Request, state: NodeState, body: wire.Holds) -> web.Response:
    """Settle holds whose key lives here now (their old owner's sweeper sends them)."""
    done = await state.holds.settle_for_peer(body.holds)
    if isinstance(done, str):
        return problem(400, "bad-holds", done)
    return json_response({"settled": done})


@internal(wire.Holds, slug="bad-holds")
async def adopt_holds(request: web.Request, state: NodeState, body: wire.Holds) -> web.Response:
    """Take over holds of keys that moved here (the old owner's copy is done)."""
    added = await state.holds.adopt(body.holds)
    if isinstance(added, str):
        return problem(400, "bad-holds", added)
    return json_response({"adopted": added})
