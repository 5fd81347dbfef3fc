"""A copy step's moves to a target whose Redis this node reaches: each key is read here
(PTTL and DUMP) and RESTOREd straight into the target's primary (docs/resharding.md,
"Background copy" and "Resharding with replicas"), and dropped here once the target
holds it (a replica of it too, when it has replicas: node/migration/durable.py)."""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import (
    BusyLoadingError,
    MasterDownError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)

from cluster import wire
from node.errors import PeerError
from node.migration.copy_step import MOVE_CHUNK
from node.migration.peer_client import Endpoints, PeerClient, RedisAddress
from node.migration.peer_redis import PeerRedis
from node.store.redispy_pipe import Sender, replies_or_raise
from node.store.resp import EachKey

__all__ = ["LANDED_GROUP", "DirectMover"]

log = logging.getLogger("shardlimit.node")
# Keys per move to a target that has (or may have) replicas: copies of MOVE_CHUNK keys,
# then one LANDED_PATH call (a replica barrier) for all of them.
LANDED_GROUP = 500
# A target's Redis that does not answer a chunk's RESTOREs in this long is taken for gone
# (the keys go through its node's import endpoint).
RESTORE_TIMEOUT_S = 10.0
# The error replies of an address that is no longer a writable primary.
_GONE = (ReadOnlyError, MasterDownError, BusyLoadingError)
# The error reply of a RESTORE over a key the target holds.
_HELD = "BUSYKEY"


class DirectMover:
    """Copies keys from this node's Redis to the targets' (`peers` names them). Reads and
    deletions here go through `sender`, the migration's own connection to this Redis;
    RESTOREs and lookups there through the target's (PeerRedis.pipe)."""

    def __init__(self, peers: PeerClient, peer_redis: PeerRedis, sender: Sender) -> None:
        self.peers = peers
        self.peer_redis = peer_redis  # the targets' Redis, by their address
        self.sender = sender

    async def move(self, target: Endpoints, keys: list[str]) -> list[str]:
        """Copy `keys` to the target's Redis (TTL kept, never REPLACE), MOVE_CHUNK keys
        a pipeline, and drop them here; returns the keys still here (for the import
        endpoint).

        A key the target already holds (imported on first touch and maybe counted
        since) is refused with BUSYKEY and stays there as it is; it is dropped here. A
        key the target refuses for another reason stays here and goes through the
        import endpoint. A target that has (or may have) replicas keeps the keys here
        until a replica of it holds them (node/migration/durable.py). A target's
        address with no writable primary (a failover moved it, or it is down) is
        forgotten, and the keys go through the target node's import endpoint, which
        writes to its current primary, or fails the step while it has none.
        """
        address = await self.peer_redis.address(target)
        if address is None:
            return keys
        durable = self.peers.replicated.get(target, True)  # unknown: as if it had
        left: list[str] = []
        for start in range(0, len(keys), MOVE_CHUNK):
            refused = await self.copy_chunk(address, keys[start : start + MOVE_CHUNK], durable)
            if refused is None:
                await self._forget(target, address)
                return left + await self._still_here(keys if durable else keys[start:])
            if not durable:  # else the landed call settles every key of the move
                left += refused
        return await self._drop_landed(target, address, keys) if durable else left

    async def copy_chunk(
        self, address: RedisAddress, keys: list[str], keep: bool
    ) -> list[str] | None:
        """One chunk: PTTL and DUMP of each key here (one pipeline), RESTORE of each at
        `address` (one pipeline), then, unless `keep`, one UNLINK here of the keys the
        target now holds: those restored, and those it refused as holding them already
        (BUSYKEY). Returns the keys the target refused for another reason (they stay
        here: the import endpoint's to settle); None when no writable primary answered
        at `address` (node/migration/durable.py).

        This node's copy of a moving key is frozen (nothing here writes it), so the read
        and the deletion need not be one step (as MIGRATE's are, which held this Redis
        for the whole round trip, the target's RESTOREs included, about 5 µs a key):
        meanwhile the key is at both shards, as it is for a replicated target. A key the
        target already holds is the current one: the target writes a moving key only
        after importing it (from this frozen copy), and no earlier migration left a copy
        there (Migrator.missing_markers)."""
        read = replies_or_raise(await self.sender.execute(EachKey(("PTTL", "DUMP"), keys)))
        restores: list[tuple[str, str, int, bytes]] = []
        for key, ttl, payload in zip(keys, read[0::2], read[1::2], strict=True):
            if payload is None:
                continue  # expired since it was found
            # PTTL -1: no expiry, RESTORE's 0; under a millisecond left reads 0: kept 1.
            restores.append(("RESTORE", key, 0 if ttl == -1 else max(int(ttl), 1), payload))
        if not restores:
            return []
        try:
            async with asyncio.timeout(RESTORE_TIMEOUT_S):
                answers = await self.peer_redis.pipe(address).execute(restores)
        except (RedisError, OSError, TimeoutError) as exc:
            log.info("copy to %s:%s: %s", address[0], address[1], str(exc) or type(exc).__name__)
            await self.peer_redis.forget(address)  # a pipe that timed out may answer late
            return None
        there: list[str] = []
        refused: list[str] = []
        for (_, key, _, _), answer in zip(restores, answers, strict=True):
            if not isinstance(answer, ResponseError) or str(answer).startswith(_HELD):
                there.append(key)
            elif isinstance(answer, _GONE):
                log.info("copy to %s:%s: %s", address[0], address[1], answer)
                return None
            else:
                refused.append(key)
        if not keep:
            await self._unlink(there)
        return refused

    async def _still_here(self, keys: list[str]) -> list[str]:
        present = replies_or_raise(await self.sender.execute(EachKey(("EXISTS",), keys)))
        return [key for key, here in zip(keys, present, strict=True) if here]

    async def _drop_landed(
        self, target: Endpoints, address: RedisAddress, keys: list[str]
    ) -> list[str]:
        """After a kept copy: drop here the keys the target's primary holds, answered
        once a replica of it holds them too; returns the others (to be imported). A
        target of an older version (no such endpoint) has no replica barrier: its Redis
        is asked directly, as for a target without replicas."""
        try:
            answer = await self.peers.post(target, wire.LANDED_PATH, {"keys": keys})
        except PeerError as exc:
            if exc.status != 404:
                raise
            self.peers.replicated[target] = False
            return await self._drop_if_there(address, keys)
        self.peers.replicated[target] = bool(answer.get("replicated", True))
        missing = set(answer.get("missing", keys))
        await self._unlink([key for key in keys if key not in missing])
        return [key for key in keys if key in missing]

    async def _forget(self, target: Endpoints, address: RedisAddress) -> None:
        self.peers.forget_redis(target)
        await self.peer_redis.forget(address)

    async def _drop_if_there(self, address: RedisAddress, keys: list[str]) -> list[str]:
        """Of `keys`, drop here those the target's Redis already has (the current copy:
        see copy_chunk); the others are returned (to go through the import endpoint)."""
        if not keys:
            return keys
        try:
            async with asyncio.timeout(RESTORE_TIMEOUT_S):
                there = await self.peer_redis.pipe(address).execute(EachKey(("EXISTS",), keys))
            replies_or_raise(there)
        except (RedisError, OSError, TimeoutError):
            await self.peer_redis.forget(address)  # a pipe that timed out may answer late
            return keys
        await self._unlink([key for key, found in zip(keys, there, strict=True) if found])
        return [key for key, found in zip(keys, there, strict=True) if not found]

    async def _unlink(self, keys: list[str]) -> None:
        if keys:
            replies_or_raise(await self.sender.execute([("UNLINK", *keys)]))
