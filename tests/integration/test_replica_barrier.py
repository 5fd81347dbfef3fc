"""The piece a migration between replicated shards stands on (node/migration/durable.py),
on real redis-servers: the replica barrier behind the keys a target says it holds."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio as aioredis

from cluster.local.redis_proc import RedisProcess
from node.migration.durable import BARRIER_KEY, held

pytestmark = pytest.mark.timeout(60)


async def test_held_names_the_missing_keys_behind_a_replica_barrier(
    primary_and_replica: tuple[RedisProcess, RedisProcess],
) -> None:
    primary, replica = primary_and_replica
    client = aioredis.Redis(port=primary.port)
    await client.mset({"c1|a": 1, "c1|b": 2})
    assert await held(client, ["c1|a", "c1|b"], True) == ([], 1)
    assert await held(client, ["c1|a", "c1|x", "c1|b"], True) == (["c1|x"], 1)
    assert await held(client, ["c1|a", "c1|x"], False) == (["c1|x"], -1)  # no barrier asked
    assert await client.exists(BARRIER_KEY) == 0  # the barrier leaves no key behind
    # The barrier is the primary's replication stream: what the replica acknowledged
    # includes every key written before it, by any connection.
    assert redis.Redis(port=replica.port).mget("c1|a", "c1|b") == [b"1", b"2"]

    replica.pause()  # SIGSTOP: connected, silent
    try:
        await client.set("c1|c", 3)
        assert await held(client, ["c1|c"], True, wait_ms=300) == ([], 0)  # none in time
    finally:
        replica.resume()
    await client.aclose()
