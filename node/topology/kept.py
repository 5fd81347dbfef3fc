"""A node's topology: adopted from routers, kept in its own Redis across restarts, and
never taken from a router of another cluster.

A shard may be served by several endpoints (node processes on one Redis). Adopting a
topology raises the shard's epoch fence (SHARD_EPOCH_KEY) with the kept topology, in one
script: counter scripts placed by an older epoch then refuse to run, whichever endpoint
sends them, and an endpoint they refuse adopts the topology the shard keeps (catch_up)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import NamedTuple

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from cluster.model.keys import DECISION_FENCE_KEY, SHARD_EPOCH_KEY, TOPOLOGY_KEY
from cluster.model.topology import Topology
from node.errors import PeerError
from node.store.scripts import read_lua
from node.topology.current import CurrentTopology
from node.topology.epoch_gate import EpochGate

__all__ = ["KeptTopology", "Refused"]

log = logging.getLogger("shardlimit.node")


# A topology is adopted only once the shard's Redis keeps it (its epoch fence raised):
# tries of the keep, a pause apart, before the push is refused as unavailable. A connect
# timing out on a busy host is the case they cover; the router pushes again after.
KEEP_TRIES = 3
KEEP_RETRY_S = 0.2


class Refused(NamedTuple):
    kind: str  # "stale-epoch", "other-cluster", or "redis-unavailable"
    detail: str

    @property
    def status(self) -> int:
        """The HTTP status of the refusal: a conflict, or the shard's Redis not answering."""
        return 503 if self.kind == "redis-unavailable" else 409


class KeptTopology:
    """Adopts topologies into `current`, one at a time, keeping each in `client`'s Redis;
    `gate` holds an adoption's answer until older work drained."""

    def __init__(self, current: CurrentTopology, client: aioredis.Redis, gate: EpochGate) -> None:
        self.current = current
        self.client = client
        self.gate = gate
        self.lock = asyncio.Lock()  # one install at a time
        self.loaded = False  # the kept topology was read (it is read once)
        self.keep_script = client.register_script(read_lua("keep_topology.lua"))
        self._catching_up: asyncio.Task[None] | None = None

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
        kept = _readable(raw)
        if kept is None:
            return
        current.adopt(kept)
        log.info("topology epoch %d of cluster %s restored", kept.epoch, kept.cluster_id)

    async def catch_up(self) -> None:
        """Another endpoint of the shard adopted a newer topology (a script refused work
        of this one's epoch): adopt the one the shard keeps, as a push would be. The many
        batches refused at once share one read. Raises RedisError or OSError."""
        if self._catching_up is None or self._catching_up.done():
            self._catching_up = asyncio.get_running_loop().create_task(self._adopt_kept())
        await asyncio.shield(self._catching_up)

    async def follow_shard(self) -> None:
        """catch_up() if an endpoint of the shard adopted a newer topology than this
        one's: one GET of the shard's epoch when none did. Raises RedisError or OSError."""
        shard_epoch = await self.client.get(SHARD_EPOCH_KEY)
        if shard_epoch is not None and int(shard_epoch) > self.current.epoch:
            await self.catch_up()

    async def _adopt_kept(self) -> None:
        kept = _readable(await self.client.get(TOPOLOGY_KEY))
        if kept is not None and kept.epoch > self.current.epoch:
            refused = await self.install(kept)
            if refused is None:
                log.info("topology epoch %d adopted from the shard's Redis", kept.epoch)

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
                newer = await self._keep(topology)
                if isinstance(newer, Refused):
                    return newer
                if newer is not None:
                    # Another endpoint of the shard is ahead: take what it took instead.
                    if self.refusal(newer) is None:
                        await self._adopt(newer)
                    return Refused("stale-epoch", f"the shard has epoch {newer.epoch}")
                await self._adopt(topology)
        await self.gate.drained(topology.epoch)
        return None

    async def _adopt(self, topology: Topology) -> None:
        self.current.adopt(topology)
        node_id = self.current.node_id
        if topology.node(node_id) is not None and node_id not in topology.successors:
            await self._unfence()  # a member again (re-added under its old id)

    async def _keep(self, topology: Topology) -> Topology | Refused | None:
        """Keep the topology in the shard's Redis and raise its epoch fence; the topology
        the shard keeps instead when an endpoint of it adopted a newer one, or Refused
        when the Redis did not answer (adopted unkept, an endpoint of the shard behind it
        would go on serving the older epoch)."""
        for tried in range(1, KEEP_TRIES + 1):
            try:
                reply = await self.keep_script(
                    keys=[TOPOLOGY_KEY, SHARD_EPOCH_KEY],
                    args=[topology.epoch, orjson.dumps(topology.to_dict())],
                )
                break
            except (RedisError, OSError) as exc:
                if tried == KEEP_TRIES:
                    log.warning("topology epoch %d not kept in Redis: %s", topology.epoch, exc)
                    return Refused(
                        "redis-unavailable",
                        f"topology epoch {topology.epoch} not taken: the node's Redis did "
                        f"not keep it ({exc})",
                    )
                await asyncio.sleep(KEEP_RETRY_S)  # then try the Redis again
        if reply[0] == 1:
            return None
        newer = _readable(reply[2]) if len(reply) > 2 else None
        if newer is None or newer.epoch <= topology.epoch:
            log.error("the shard is at epoch %d but keeps no readable topology", reply[1])
            return None
        return newer

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


def _readable(raw: bytes | str | None) -> Topology | None:
    """A kept topology, or None (nothing kept, or unreadable: logged)."""
    if raw is None:
        return None
    try:
        return Topology.from_dict(orjson.loads(raw))
    except (ValueError, TypeError, KeyError, orjson.JSONDecodeError) as exc:
        log.error("the kept topology in %s is unreadable, ignored: %s", TOPOLOGY_KEY, exc)
        return None
