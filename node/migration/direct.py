"""A copy step's moves to a target that takes MIGRATE: keys go Redis to Redis, straight
into the target's primary (docs/resharding.md, "Background copy" and "Resharding with
replicas"), and are dropped here once the target holds them (a replica of it too, when
it has replicas: node/migration/durable.py)."""

from __future__ import annotations

import logging

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from cluster import wire
from node.errors import PeerError
from node.migration.copy_step import MIGRATE_CHUNK
from node.migration.durable import target_gone
from node.migration.peer_client import Endpoints, PeerClient, RedisAddress
from node.migration.peer_redis import PeerRedis
from node.store.redispy_pipe import RedisPyPipe
from node.store.resp import RespPipe

__all__ = ["LANDED_GROUP", "DirectMover"]

log = logging.getLogger("shardlimit.node")
# Keys per move to a target that has (or may have) replicas: MIGRATE calls of
# MIGRATE_CHUNK keys, then one LANDED_PATH call (a replica barrier) for all of them.
LANDED_GROUP = 5 * MIGRATE_CHUNK


class DirectMover:
    """MIGRATE from this node's Redis (`client`) to the targets' (`peers` names them)."""

    def __init__(self, client: aioredis.Redis, peers: PeerClient, peer_redis: PeerRedis) -> None:
        self.client = client
        self.peers = peers
        self.peer_redis = peer_redis  # the targets' Redis (the MIGRATE address): _drop_if_there
        # MIGRATE calls go through a lean pipe of their own (hiredis packs a call's hundred
        # names), not the check path's: redis-py's generic client (TLS) where it cannot.
        self.pipe = RespPipe.for_client(client)
        self.sender: RespPipe | RedisPyPipe = self.pipe or RedisPyPipe(client)

    async def move(self, target: Endpoints, keys: list[str]) -> list[str]:
        """Redis-to-Redis MIGRATE (TTL kept, never REPLACE), MIGRATE_CHUNK keys a call;
        returns the keys still here (for the import endpoint).

        Without REPLACE a key the target already holds (imported on first touch and
        maybe counted since) is refused with BUSYKEY and stays here; it is dropped
        here if the target has it, else it goes through the import endpoint.
        A target that has (or may have) replicas gets the keys by MIGRATE COPY: they
        are dropped here once a replica of it holds them (node/migration/durable.py).
        A MIGRATE that finds no writable primary at the target's address (a failover
        moved it, or it is down; or MIGRATE cannot speak to it: TLS) forgets that
        address, and the keys go through the target node's import endpoint, which
        writes to its current primary, or fails the step while it has none.
        """
        address = await self.peer_redis.address(target)
        if address is None:
            return keys
        durable = self.peers.replicated.get(target, True)  # unknown: as if it had
        left: list[str] = []
        for start in range(0, len(keys), MIGRATE_CHUNK):
            chunk = keys[start : start + MIGRATE_CHUNK]
            done = await self._migrate(address, chunk, copy=durable)
            if done is None:
                await self._forget(target, address)
                return left + await self._still_here(keys if durable else keys[start:])
            if not done and not durable:
                left += await self._drop_if_there(address, await self._still_here(chunk))
        return await self._drop_landed(target, address, keys) if durable else left

    async def _migrate(self, address: RedisAddress, keys: list[str], copy: bool) -> bool | None:
        """One MIGRATE call: True, False when the target refused some keys (BUSYKEY), None
        when no writable primary answered at `address` (node/migration/durable.py)."""
        host, port, db = address
        copying = ("COPY",) if copy else ()
        command = ("MIGRATE", host, port, "", db, 10_000, *copying, "KEYS", *keys)
        (reply,) = await self.sender.execute([command])
        if isinstance(reply, ResponseError):
            if target_gone(reply):
                log.info("MIGRATE to %s:%s: %s", host, port, reply)
                return None
            return False
        return True

    async def close(self) -> None:
        if self.pipe is not None:
            await self.pipe.close()

    async def _still_here(self, keys: list[str]) -> list[str]:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.exists(key)
        present = await pipe.execute()
        return [key for key, here in zip(keys, present, strict=True) if here]

    async def _drop_landed(
        self, target: Endpoints, address: RedisAddress, keys: list[str]
    ) -> list[str]:
        """After MIGRATE COPY: drop here the keys the target's primary holds, answered
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
        drop = [key for key in keys if key not in missing]
        if drop:
            await self.client.delete(*drop)
        return [key for key in keys if key in missing]

    async def _forget(self, target: Endpoints, address: RedisAddress) -> None:
        self.peers.forget_redis(target)
        await self.peer_redis.forget(address)

    async def _drop_if_there(self, address: RedisAddress, keys: list[str]) -> list[str]:
        """Of the keys MIGRATE left here, drop those the target's Redis already has;
        the others are returned (to go through the import endpoint).

        A moving key present at the target is the current one: the target writes it
        only after importing it (from this frozen copy), and no earlier migration left
        a copy there. So the import script would do nothing for it but set a marker,
        which the target's first touch no longer needs (Migrator.missing_markers).
        Asking the target's Redis directly saves an HTTP call through the target node
        per chunk that met a key a live check had already pulled."""
        if not keys:
            return keys
        try:
            pipe = self.peer_redis.client(address).pipeline(transaction=False)
            for key in keys:
                pipe.exists(key)
            there = await pipe.execute()
        except (RedisError, OSError):
            return keys
        drop = [key for key, found in zip(keys, there, strict=True) if found]
        if drop:
            await self.client.delete(*drop)
        return [key for key, found in zip(keys, there, strict=True) if not found]
