"""The shard's replication as the node sees it, for /stats (and so `GET /v1/cluster`,
`shardlimit status`, /ui) and /metrics:

    {"replicated": bool, "primary": "host:port", "role": "master",
     "replicas": [{"addr": "host:port", "lag_ms": int | None, "up": bool}], "failovers": N}

`replicas` joins the primary's INFO replication (the replicas connected to it, with
the time since each last acknowledged the stream: Redis counts it in whole seconds)
with the replicas a Sentinel knows, so one that is down is listed too, as not up (`up`:
online at the primary, and, as the Sentinels last read it, promotable and following the
stream: node/store/connect.py `sentinel_replicas`).
`failovers` counts the promotions this node followed since it started.
A shard without Sentinel is not `replicated`: its `durability: replica` rules are
served as `primary` ones (nothing waits for a replica).
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from node.store.connect import host_port, sentinel_pool, sentinel_replicas
from node.store.replica_presence import listed_replicas

__all__ = ["replication_status"]


def _connected(info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """addr -> {"lag_ms", "up"} of the replicas INFO replication lists."""
    return {
        addr: {
            # Whole seconds since its last ACK, by Redis' cached clock: -1 when the ACK
            # came after the clock's last tick.
            "lag_ms": max(0, int(value["lag"])) * 1000 if value.get("lag") is not None else None,
            "up": value.get("state") == "online",
        }
        for addr, value in listed_replicas(info).items()
    }


async def replication_status(
    client: aioredis.Redis, failovers: int, info: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`info`: the primary's INFO replication when already read. Raises RedisError when
    the primary does not answer."""
    if info is None:
        info = await client.info("replication")
    pool = sentinel_pool(client)
    if pool is not None and pool.master_address is not None:
        primary = host_port(*pool.master_address)
    else:
        kwargs = client.connection_pool.connection_kwargs
        primary = host_port(kwargs.get("host", "?"), kwargs.get("port", 0))
    replicas = _connected(info)
    for addr, seen_up in (await sentinel_replicas(client) or {}).items():
        entry = replicas.setdefault(addr, {"lag_ms": None, "up": False})
        entry["up"] = entry["up"] and seen_up
    return {
        "replicated": pool is not None,
        "primary": primary,
        "role": str(info.get("role", "")),
        "replicas": [{"addr": addr, **entry} for addr, entry in sorted(replicas.items())],
        "failovers": failovers,
    }
