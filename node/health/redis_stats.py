"""What a node's stats (`GET /node/v1/stats`: `GET /v1/cluster`, `shardlimit status`,
/ui) say of its Redis, read in two round trips: every node is asked at once, while live
checks wait on the same Redis. The routers' epoch poll asks for the brief stats, which
read only the rules version."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from cluster.model.keys import RULES_KEY
from node.health.metrics import held_keys
from node.health.replication import replication_status
from node.store.connect import primary_address

__all__ = ["eviction_warning", "redis_stats", "rules_version"]


async def redis_stats(client: aioredis.Redis, failovers: int) -> dict[str, Any]:
    """keys (for limits: not the rules, topology, fence), memory, the primary's address
    (`redis`), replication, rules_version, redis_version. Raises RedisError."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.hget(RULES_KEY, "version")
        pipe.info("memory")
        pipe.info("server")
        pipe.info("replication")
        version, memory, server, replication = await pipe.execute()
    return {
        "keys": await held_keys(client),
        "memory": memory["used_memory"],
        # The run_id lets a peer check that the address reaches this Redis from there.
        "redis": {**await primary_address(client), "run_id": server.get("run_id", "")},
        "replication": await replication_status(client, failovers, replication),
        "rules_version": int(version or 0),
        "redis_version": str(server.get("redis_version", "")),
    }


async def rules_version(client: aioredis.Redis) -> int:
    """The version of the rules document the shard's Redis holds (0: none)."""
    return int(await client.hget(RULES_KEY, "version") or 0)


async def eviction_warning(client: aioredis.Redis) -> str | None:
    """Why this Redis cannot keep limits exact, or None: a `maxmemory-policy` other than
    noeviction evicts counters when memory runs out (each evicted limit starts again from
    zero), and the rules and topology with them. Raises RedisError."""
    memory = await client.info("memory")
    policy = str(memory.get("maxmemory_policy", "noeviction"))
    if policy == "noeviction":
        return None
    return (
        f"the node's Redis has maxmemory-policy {policy}: once full it evicts counters, and "
        "their limits start again from zero; set maxmemory-policy noeviction (a full "
        "Redis then answers checks degraded, consuming nothing)"
    )
