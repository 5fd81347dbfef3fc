"""A node's topology: adopted from routers, kept in its own Redis across restarts, and
never taken from a router of another cluster."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import NamedTuple

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from cluster.model.keys import DECISION_FENCE_KEY, TOPOLOGY_KEY
from cluster.model.topology import Topology
from node.errors import PeerError
from node.topology.current import CurrentTopology
from node.topology.epoch_gate import EpochGate

__all__ = ["KeptTopology", "Refused"]

log = logging.getLogger("shardlimit.node")


class Refused(NamedTuple):
    kind: str  # "stale-epoch" or "other-cluster"
    detail: str


class KeptTopology:
    """Adopts topologies into `current`, one at a time, keeping each in `client`'s Redis;
    `gate` holds an adoption's answer until older work drained."""

    def __init__(self, current: CurrentTopology, client: aioredis.Redis, gate: EpochGate) -> None:
        self.current = current
        self.client = client
        self.gate = gate
        self.lock = asyncio.Lock()  # one install at a time
        self.loaded = False  # the kept topology was read (it is read once)

    async def load_persisted(self) -> None:
        """Take the topology this node's Redis kept, once (at start, or at the first push
        if Redis was down then)."""
        if self.loaded:
            return
        try:
            raw = await self.client.get(TOPOLOGY_KEY)
        except (RedisError, OSError) as exc:
            log.warning("could not read the kept topology (will try again): %s", exc)
            return
        self.loaded = True
        current = self.current
        if raw is None or current.topology is not None:
            return
        try:
            current.adopt(Topology.from_dict(orjson.loads(raw)))
        except (ValueError, TypeError, KeyError, orjson.JSONDecodeError) as exc:
            log.error("the kept topology in %s is unreadable, ignored: %s", TOPOLOGY_KEY, exc)
            return
        cluster_id = current.topology.cluster_id if current.topology else None
        log.info("topology epoch %d of cluster %s restored", current.epoch, cluster_id)

    def refusal(self, topology: Topology) -> Refused | None:
        current = self.current.topology
        if current is not None and current.cluster_id not in (None, topology.cluster_id):
            return Refused(
                "other-cluster",
                f"node {self.current.node_id} belongs to cluster {current.cluster_id}, "
                f"not {topology.cluster_id}",
            )
        if current is not None and topology.epoch < current.epoch:
            return Refused("stale-epoch", f"have epoch {current.epoch}")
        return None

    async def install(self, topology: Topology) -> Refused | None:
        """Adopt a topology unless it is older or of another cluster; returns why not.
        Acknowledged (returns) only once work of older epochs reached Redis."""
        async with self.lock:
            await self.load_persisted()
            refused = self.refusal(topology)
            if refused is not None:
                return refused
            current = self.current.topology
            if (
                current is None
                or topology.epoch > current.epoch
                or (current.cluster_id is None and topology.cluster_id is not None)
            ):
                self.current.adopt(topology)
                await self._persist(topology)
                node_id = self.current.node_id
                if topology.node(node_id) is not None and node_id not in topology.successors:
                    await self._unfence()  # a member again (re-added under its old id)
        await self.gate.drained(topology.epoch)
        return None

    async def _persist(self, topology: Topology) -> None:
        try:
            await self.client.set(TOPOLOGY_KEY, orjson.dumps(topology.to_dict()))
        except (RedisError, OSError) as exc:
            log.warning("topology epoch %d adopted but not kept in Redis: %s", topology.epoch, exc)

    @contextlib.asynccontextmanager
    async def moves_of_epoch(self, epoch: int) -> AsyncIterator[None]:
        """One move of a copy step begun under `epoch`: refused once the node took another
        topology (an abort), and counted like a batch meanwhile, so a new topology is
        acknowledged only after the move in flight reached both Redis."""
        now = self.current.epoch
        if now != epoch:
            raise PeerError(f"the topology moved on to epoch {now}: copy step stopped")
        async with self.gate.hold(epoch):
            yield

    async def _unfence(self) -> None:
        try:
            await self.client.delete(DECISION_FENCE_KEY)
        except (RedisError, OSError) as exc:
            log.warning("could not lift the decisions fence: %s", exc)
