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
from node.store.reply_errors import write_refusal

__all__ = ["eviction_warning", "redis_stats", "rules_version", "unready_because"]


async def redis_stats(client: aioredis.Redis, failovers: int) -> dict[str, Any]:
    """keys (for limits: not the rules, topology, fence), memory, what keeps this Redis
    from keeping limits (`redis_problem`), the primary's address (`redis`), replication,
    rules_version, redis_version. Raises RedisError."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.hget(RULES_KEY, "version")
        pipe.info("memory")
        pipe.info("server")
        pipe.info("replication")
        pipe.info("persistence")
        version, memory, server, replication, persistence = await pipe.execute()
    return {
        "keys": await held_keys(client),
        "memory": memory["used_memory"],
        "redis_problem": redis_problem(memory, persistence),
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
    return _evicting(await client.info("memory"))


def _evicting(memory: dict[str, Any]) -> str | None:
    policy = str(memory.get("maxmemory_policy", "noeviction"))
    if policy == "noeviction":
        return None
    return (
        f"the node's Redis has maxmemory-policy {policy}: once full it evicts counters, and "
        "their limits start again from zero; set maxmemory-policy noeviction (a full "
        "Redis then answers checks degraded, consuming nothing)"
    )


async def unready_because(client: aioredis.Redis) -> str | None:
    """None when this Redis answers and takes writes (the node's readiness), else why it
    refuses them. Raises RedisError when it does not answer."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.ping()
        pipe.info("memory")
        pipe.info("persistence")
        pong, memory, persistence = await pipe.execute(raise_on_error=False)
    for reply in (memory, persistence):
        if isinstance(reply, Exception):
            raise reply
    refusing = _refusing_writes(memory, persistence)
    if refusing is None and isinstance(pong, Exception):
        # While it cannot persist (MISCONF), Redis refuses PING with the writes.
        if write_refusal(pong) is None:
            raise pong
        return f"refusing writes: {pong}"
    return refusing


def _refusing_writes(memory: dict[str, Any], persistence: dict[str, Any]) -> str | None:
    used, most = int(memory.get("used_memory", 0)), int(memory.get("maxmemory", 0))
    if 0 < most <= used and memory.get("maxmemory_policy", "noeviction") == "noeviction":
        return f"full: used_memory {used} of maxmemory {most}; writes are refused (OOM)"
    if persistence.get("aof_last_write_status", "ok") != "ok":
        return "its last AOF write failed (a full disk?): writes are refused (MISCONF)"
    return None


def redis_problem(memory: dict[str, Any], persistence: dict[str, Any]) -> str | None:
    """What INFO shows that keeps this Redis from serving limits exactly, or None: writes
    refused (full under noeviction, or its last AOF or RDB write failed: MISCONF), or an
    evicting policy. Checks then answer degraded (`refused`), and the node is not ready."""
    refusing = _refusing_writes(memory, persistence)
    if refusing is not None:
        return refusing
    if persistence.get("rdb_last_bgsave_status", "ok") != "ok":
        return "its last RDB save failed: writes may be refused (MISCONF)"
    return _evicting(memory)
