"""This node's connections to other shards' Redis, by the address their node's stats
name (a copy's target, to RESTORE moving keys into and look for keys it refused; a
migration source's, to read moving keys on first touch): the same network, no
credentials of their own.

An address is used only once the Redis it reaches from here answers the run_id the
shard's stats gave: a node whose `--redis` names a loopback address (a Redis beside it
in its pod) reports an address that, from another host, reaches another Redis, this
node's own. Read there, a first touch would import nothing and count from zero, and a
copy would restore keys into their own source. Such a shard
is reached through its node's endpoints instead."""

from __future__ import annotations

import logging

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from node.migration.peer_client import Endpoints, PeerClient, RedisAddress
from node.store.resp import RespPipe

__all__ = ["PeerRedis"]

log = logging.getLogger("shardlimit.node")
CONNECT_TIMEOUT_S = 2.0
# A read on a live check's path: as long as the export call it stands in for may take.
CALL_TIMEOUT_S = 5.0


class PeerRedis:
    def __init__(self, peers: PeerClient) -> None:
        self.peers = peers
        self._clients: dict[RedisAddress, aioredis.Redis] = {}
        self._pipes: dict[RedisAddress, RespPipe] = {}  # RESTOREs and first-touch reads
        self._checked: dict[tuple[RedisAddress, str], bool] = {}  # reaches that run_id?

    async def address(self, endpoints: Endpoints) -> RedisAddress | None:
        """Where a shard's Redis primary is reached from here, or None (not known now, or
        that address reaches another Redis from here)."""
        identity = await self.peers.redis_identity(endpoints)
        if identity is None or not identity[1]:
            return None
        address, run_id = identity
        reaches = self._checked.get(identity)
        if reaches is None:
            try:
                info = await self.client(address).info("server")
            except (RedisError, OSError):
                return None
            reaches = self._checked[identity] = info.get("run_id") == run_id
            if not reaches:
                log.warning(
                    "%s:%s is not shard %s's Redis from here: it is reached through its node",
                    *address[:2],
                    endpoints[0],
                )
        return address if reaches else None

    def client(self, address: RedisAddress) -> aioredis.Redis:
        client = self._clients.get(address)
        if client is None:
            host, port, db = address
            client = aioredis.Redis(
                host=host,
                port=port,
                db=db,
                socket_connect_timeout=CONNECT_TIMEOUT_S,
                socket_timeout=CALL_TIMEOUT_S,
                # One try: a Redis not reached from here (TLS, a password) is then read
                # through its node at once, not after redis-py's retries (~3.6 s, again
                # for every copy step).
                retry=Retry(NoBackoff(), 0),
            )
            self._clients[address] = client
        return client

    def pipe(self, address: RedisAddress) -> RespPipe:
        """A lean pipe to `address` (node/store/resp.py): a copy's RESTOREs into a target,
        a first touch's reads from a source. It has no read timeout: callers bound it."""
        pipe = self._pipes.get(address)
        if pipe is None:
            host, port, db = address
            pipe = self._pipes[address] = RespPipe(
                host=host, port=port, db=db, connect_timeout_s=CONNECT_TIMEOUT_S
            )
        return pipe

    async def forget(self, address: RedisAddress) -> None:
        client = self._clients.pop(address, None)
        if client is not None:
            await client.aclose()
        pipe = self._pipes.pop(address, None)
        if pipe is not None:
            await pipe.close()

    async def close(self) -> None:
        for address in {*self._clients, *self._pipes}:
            await self.forget(address)
