"""The holds sweeper of a shard with two endpoints runs on one of them at a time, under a
lease in the shard's Redis; when its holder dies, the other takes it within about the
lease's TTL and settles the shard's holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio as aioredis

from cluster import wire
from cluster.local.redis_proc import RedisProcess
from cluster.model.keys import HOLDS_KEY, SWEEPER_LEASE_KEY, counter_key
from cluster.model.limits import LimitSpec
from tests.conftest import eventually
from tests.support.shard_endpoints import Shard, shard_endpoints

pytestmark = pytest.mark.timeout(90)

QUOTA = LimitSpec("quota", 5)
SCOPE = "held"


async def holders(shard: Shard) -> list[bool]:
    """Each live endpoint's `singleton` (whether it holds the sweeper lease)."""
    return [
        (await shard.stats(url))["singleton"]
        for url, endpoint in zip(shard.urls, shard.endpoints, strict=True)
        if endpoint.alive
    ]


async def test_one_endpoint_sweeps_and_another_takes_over_when_it_dies(
    redis_servers: list[RedisProcess], tmp_path: Path
) -> None:
    async with shard_endpoints(redis_servers[0], tmp_path) as shard:
        for url in shard.urls:
            assert (await shard.push(url, 1))[0] == 200

        seen: list[bool] = []

        async def exactly_one_holds() -> bool:
            seen[:] = await holders(shard)
            return sorted(seen) == [False, True]

        await eventually(exactly_one_holds)
        holder = seen.index(True)
        other = 1 - holder
        shard.endpoints[holder].kill()

        async def the_other_holds() -> bool:
            return bool((await shard.stats(shard.urls[other]))["singleton"])

        await eventually(the_other_holds, within=5.0)

        # The survivor sweeps: a hold that runs out (no batch: it is given back) is settled.
        hold = wire.Op(
            "check",
            "k",
            SCOPE,
            [QUOTA.to_wire()],
            [0],
            1,
            request_id="r1",
            record_ttl_ms=60_000,
            hold_ms=100,
        )
        reply = await shard.batch(shard.urls[other], [hold])
        checked = reply.results[0]
        assert isinstance(checked, wire.Checked) and checked.allowed
        assert checked.limits[0].remaining == 4  # of QUOTA's 5
        # The counter is not read while held: on a slow host the sweeper may already have
        # given the 100 ms hold back. A counter never consumed would not exist at all.
        client = aioredis.Redis(port=shard.redis.port)
        try:
            counter = counter_key(SCOPE, QUOTA.shape, "k")

            async def given_back() -> bool:
                return await client.zcard(HOLDS_KEY) == 0

            await eventually(given_back)
            assert await client.get(counter) == b"0:0"
            assert await client.exists(SWEEPER_LEASE_KEY) == 1
        finally:
            await client.aclose()


async def test_a_clean_stop_gives_the_lease_up(
    redis_servers: list[RedisProcess], tmp_path: Path
) -> None:
    async with shard_endpoints(redis_servers[0], tmp_path, count=1) as shard:

        async def held() -> bool:
            return await holders(shard) == [True]

        await eventually(held)
        shard.endpoints[0].stop()
        client = aioredis.Redis(port=shard.redis.port)
        try:
            assert await client.exists(SWEEPER_LEASE_KEY) == 0
        finally:
            await client.aclose()
