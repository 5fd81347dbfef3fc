"""This node's connections to other shards' Redis, by the address their node's stats
name (a MIGRATE target's, to look for keys it refused; a migration source's, to read
moving keys on first touch). Reached like the MIGRATE between them: the same network,
no credentials of their own."""

from __future__ import annotations

import redis.asyncio as aioredis

from node.migration.peer_client import RedisAddress

__all__ = ["PeerRedis"]

CONNECT_TIMEOUT_S = 2.0
# A read on a live check's path: as long as the export call it stands in for may take.
CALL_TIMEOUT_S = 5.0


class PeerRedis:
    def __init__(self) -> None:
        self._clients: dict[RedisAddress, aioredis.Redis] = {}

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
            )
            self._clients[address] = client
        return client

    async def forget(self, address: RedisAddress) -> None:
        client = self._clients.pop(address, None)
        if client is not None:
            await client.aclose()

    async def close(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()
