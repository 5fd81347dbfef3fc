"""A node's topology: adopted from routers, kept in its own Redis across restarts, and
never taken from a router of another cluster."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, NamedTuple

import orjson
from redis.exceptions import RedisError

from cluster.model.keys import DECISION_FENCE_KEY, TOPOLOGY_KEY
from cluster.model.topology import Topology
from node.errors import PeerError

if TYPE_CHECKING:
    from node.state import NodeState

log = logging.getLogger("shardlimit.node")


class Refused(NamedTuple):
    kind: str  # "stale-epoch" or "other-cluster"
    detail: str


async def load_persisted(state: NodeState) -> None:
    """Take the topology this node's Redis kept, once (at start, or at the first push if
    Redis was down then)."""
    if state.topology_loaded:
        return
    try:
        raw = await state.redis.get(TOPOLOGY_KEY)
    except (RedisError, OSError) as exc:
        log.warning("could not read the kept topology (will try again): %s", exc)
        return
    state.topology_loaded = True
    if raw is None or state.topology is not None:
        return
    try:
        state.topology = Topology.from_dict(orjson.loads(raw))
    except (ValueError, TypeError, KeyError, orjson.JSONDecodeError) as exc:
        log.error("the kept topology in %s is unreadable, ignored: %s", TOPOLOGY_KEY, exc)
        return
    log.info("topology epoch %d of cluster %s restored", state.epoch, state.topology.cluster_id)


def refusal(state: NodeState, topology: Topology) -> Refused | None:
    current = state.topology
    if current is not None and current.cluster_id not in (None, topology.cluster_id):
        return Refused(
            "other-cluster",
            f"node {state.node_id} belongs to cluster {current.cluster_id}, "
            f"not {topology.cluster_id}",
        )
    if current is not None and topology.epoch < current.epoch:
        return Refused("stale-epoch", f"have epoch {current.epoch}")
    return None


async def install_topology(state: NodeState, topology: Topology) -> Refused | None:
    """Adopt a topology unless it is older or of another cluster; returns why not.
    Acknowledged (returns) only once batches of older epochs reached Redis."""
    async with state.topology_lock:
        await load_persisted(state)
        refused = refusal(state, topology)
        if refused is not None:
            return refused
        current = state.topology
        if (
            current is None
            or topology.epoch > current.epoch
            or (current.cluster_id is None and topology.cluster_id is not None)
        ):
            state.topology = topology
            await _persist(state, topology)
            if topology.node(state.node_id) is not None and state.node_id not in (
                topology.successors
            ):
                await _unfence(state)  # a member again (re-added under its old id)
    await state.wait_drained(topology.epoch)
    return None


async def _persist(state: NodeState, topology: Topology) -> None:
    try:
        await state.redis.set(TOPOLOGY_KEY, orjson.dumps(topology.to_dict()))
    except (RedisError, OSError) as exc:
        log.warning("topology epoch %d adopted but not kept in Redis: %s", topology.epoch, exc)


@contextlib.asynccontextmanager
async def moves_of_epoch(state: NodeState, epoch: int) -> AsyncIterator[None]:
    """One move of a copy step begun under `epoch`: refused once the node took another
    topology (an abort), and counted like a batch meanwhile, so a new topology is
    acknowledged only after the move in flight reached both Redis."""
    if state.epoch != epoch:
        raise PeerError(f"the topology moved on to epoch {state.epoch}: copy step stopped")
    state.inflight[epoch] += 1
    try:
        yield
    finally:
        state.inflight[epoch] -= 1
        async with state.drained:
            state.drained.notify_all()


async def _unfence(state: NodeState) -> None:
    try:
        await state.redis.delete(DECISION_FENCE_KEY)
    except (RedisError, OSError) as exc:
        log.warning("could not lift the decisions fence: %s", exc)
