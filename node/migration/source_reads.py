"""First touch without the source node in the way: moving keys read straight from the
source's Redis (docs/resharding.md, step 3).

The export endpoint makes the source take the migration's topology and wait for its
batches of older epochs before it DUMPs: from then on it never writes that migration's
moving keys again (a later epoch that gives them back, an abort, makes it pull them back
first, from here, and this node answers that export only once its own batches that
read the source's Redis finished). So once a source answered one export of a migration,
even of no key, the other keys of that migration can be read from its Redis directly:
one round trip to a Redis instead of an HTTP call through the source node, on a live
check's path.

When this node takes a migrating topology, `prepare` asks each node it gains keys from
for such an empty export, learns its Redis address and checks that it reaches that Redis
from here (node/migration/peer_redis.py), off the check path; until that is done for a
source, its keys come through its export endpoint.

The read is one transaction, sent through the lean pipe to that Redis
(node/migration/peer_redis.py), that also asks ROLE, so a demoted primary (a failover moved
the source's Redis) is never read: its address is forgotten and the export endpoint
answers instead. A source whose Redis cannot be reached from here (another network, TLS,
a password, an address that reaches another Redis from here) is read through its node.
An abort's hand-back always goes through the export endpoint: what is authoritative
there needs the source's markers and roles.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Sequence
from typing import Any

from redis.exceptions import RedisError

from cluster import wire
from cluster.model.partition import RingPartitioner, SlotPartitioner
from node.errors import PeerError
from node.migration.copy_step import MovingArcs
from node.migration.entries import ExportEntry, entries_of
from node.migration.peer_client import Endpoints, PeerClient
from node.migration.peer_redis import CALL_TIMEOUT_S, PeerRedis
from node.store.redispy_pipe import replies_or_raise
from node.topology.ownership import Ownership

__all__ = ["SourceReads", "sources_of"]

log = logging.getLogger("shardlimit.node")


def sources_of(ownership: Ownership) -> list[str]:
    """The nodes this node gains keys from in the migration `ownership` is in."""
    me, old, new = ownership.node_id, ownership.previous, ownership.topology.partitioner
    if isinstance(old, SlotPartitioner) and isinstance(new, SlotPartitioner):
        pairs = zip(old.table, new.table, strict=True)
        return sorted({before for before, after in pairs if after == me and before != me})
    if isinstance(old, RingPartitioner) and isinstance(new, RingPartitioner):
        ids = [spec.id for spec in old.nodes if spec.id != me]
        return [node for node in ids if me in MovingArcs(node, old, new).targets]
    return [spec.id for spec in old.nodes if spec.id != me] if old is not None else []


class SourceReads:
    def __init__(self, peers: PeerClient, peer_redis: PeerRedis) -> None:
        self.peers = peers
        self.peer_redis = peer_redis
        # source -> the migration in which its Redis may be read from here (it answered
        # an export of it, and its address reaches that Redis from here).
        self._ready: dict[Endpoints, str] = {}
        # (source, migration) being made ready, ready, or given up on (a read of its
        # Redis failed): started again only after a ROLE answer other than master.
        self._started: set[tuple[Endpoints, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.reads = {"node": 0, "redis": 0}  # pulls by where the keys were read

    def prepare(self, ownership: Ownership) -> None:
        """This node took `ownership`'s topology: make each source's Redis readable, in
        the background (finding the sources hashes the ring's points: not in a handler)."""
        migration_id = ownership.migration_id
        if migration_id is not None and ownership.reverts is None:
            self._spawn(self._prepare(ownership, migration_id))

    async def _prepare(self, ownership: Ownership, migration_id: str) -> None:
        previous = ownership.previous.nodes if ownership.previous is not None else ()
        specs = {spec.id: spec for spec in (*previous, *ownership.topology.nodes)}
        for node_id in sources_of(ownership):
            self._start(specs[node_id].urls, migration_id, ownership)

    def exported(self, source: Endpoints, migration_id: str) -> None:
        """`source` answered an export of `migration_id` (a first touch through it)."""
        self.reads["node"] += 1
        self._start(source, migration_id, None)

    def _start(self, source: Endpoints, migration_id: str, ownership: Ownership | None) -> None:
        if (source, migration_id) in self._started:
            return
        self._started = {started for started in self._started if started[1] == migration_id}
        self._started.add((source, migration_id))
        self._spawn(self._make_ready(source, migration_id, ownership))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _make_ready(
        self, source: Endpoints, migration_id: str, ownership: Ownership | None
    ) -> None:
        try:
            if ownership is not None:  # not yet fenced by an export of a first touch
                payload = {"keys": [], "topology": ownership.topology.to_dict()}
                await self.peers.post(source, wire.EXPORT_PATH, payload, timeout_s=5.0)
            address = await self.peer_redis.address(source)
            if address is None:
                raise PeerError("its Redis is not reached from here now")
        except PeerError as exc:  # tried again after the next export through it
            self._started.discard((source, migration_id))
            log.info("moving keys of %s are read through it for now: %s", source[0], exc)
            return
        self._ready[source] = migration_id

    def ready(self, source: Endpoints, migration_id: str) -> bool:
        """`source`'s keys of `migration_id` are read from its Redis."""
        return self._ready.get(source) == migration_id

    async def read(
        self, source: Endpoints, migration_id: str, keys: Sequence[str]
    ) -> list[ExportEntry] | None:
        """The entries of `keys` from the source's Redis, or None when they must come
        through its export endpoint."""
        if not self.ready(source, migration_id):
            return None
        address = await self.peer_redis.address(source)
        if address is None:
            return None
        commands: list[tuple[str, ...]] = [("MULTI",), ("ROLE",), ("TIME",)]
        for key in keys:
            commands += [("DUMP", key), ("PTTL", key)]
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                sent = await self.peer_redis.pipe(address).execute([*commands, ("EXEC",)])
            *_queued, replies = replies_or_raise(sent)
        except (RedisError, OSError, TimeoutError) as exc:
            why = str(exc) or type(exc).__name__  # a timeout says nothing of itself
            log.info("reading moving keys at %s:%s: %s; through its node", *address[:2], why)
            self._ready.pop(source, None)  # another read may have failed meanwhile
            self.peers.forget_redis(source)
            await self.peer_redis.forget(address)
            return None
        if replies[0][0] != b"master":
            self._ready.pop(source, None)  # made ready again by the next export through it
            self._started.discard((source, migration_id))
            self.peers.forget_redis(source)
            await self.peer_redis.forget(address)
            return None
        self.reads["redis"] += 1
        return entries_of(keys, replies[1:], reverted=False)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
