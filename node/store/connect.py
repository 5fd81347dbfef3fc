"""The node's Redis clients, from its `--redis` URL: redis://, rediss:// (TLS), unix://,
or redis+sentinel:// (cluster/model/sentinel_url.py): a primary found through Redis
Sentinel. Under Sentinel every new connection asks the Sentinels for the current
primary (a primary they see down is no primary: the call fails and the node answers
503, consuming nothing), and a reply of READONLY (a demoted primary) drops the
connection, so the next one goes to the promoted replica.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

from cluster.model.sentinel_url import is_sentinel_url, parse_sentinel_url

__all__ = ["primary_address", "redis_client"]

SENTINEL_TIMEOUT_S = 0.25  # one Sentinel's answer; the next one is asked after it


def redis_client(url: str, **options: Any) -> aioredis.Redis:
    """A client of the node's Redis primary; `options` are redis-py's connection ones."""
    if not is_sentinel_url(url):
        return aioredis.from_url(url, **options)
    target = parse_sentinel_url(url)
    sentinels = Sentinel(  # type: ignore[no-untyped-call]
        list(target.sentinels),
        socket_timeout=SENTINEL_TIMEOUT_S,
        socket_connect_timeout=SENTINEL_TIMEOUT_S,
    )
    client: aioredis.Redis = sentinels.master_for(
        target.master,
        db=target.db,
        username=target.username,
        password=target.password,
        **options,
    )
    return client


async def primary_address(client: aioredis.Redis) -> dict[str, Any]:
    """{"host", "port", "db"} of the primary `client` writes to now (a peer's MIGRATE
    target); under Sentinel, as the Sentinels name it."""
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    if isinstance(pool, SentinelConnectionPool):
        host, port = await pool.get_master_address()  # type: ignore[no-untyped-call]
        return {"host": host, "port": int(port), "db": kwargs.get("db", 0)}
    return {"host": kwargs.get("host"), "port": kwargs.get("port"), "db": kwargs.get("db", 0)}
