"""The shard's epoch fence: two endpoints (node processes of one node id) on one Redis.
A topology adopted by one of them is known to the shard's Redis at once: a batch the other
sends by its older epoch applies nothing, is answered `moved` with the newer epoch, and
that endpoint adopts the newer topology."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio as aioredis

from cluster import wire
from cluster.local.redis_proc import RedisProcess
from cluster.model.keys import SHARD_EPOCH_KEY, counter_key
from cluster.model.limits import LimitSpec
from tests.support.shard_endpoints import Shard, shard_endpoints

pytestmark = pytest.mark.timeout(90)

QUOTA = LimitSpec("quota", 5)
SCOPE = "fenced"


def check(key: str) -> wire.Op:
    return wire.Op("check", key, SCOPE, [QUOTA.to_wire()], [0], 1)


async def used(shard: Shard, key: str) -> bytes | str | None:
    """The quota counter of `key` as the shard's Redis holds it ("count:amount")."""
    client = aioredis.Redis(port=shard.redis.port)
    try:
        value: bytes | str | None = await client.get(counter_key(SCOPE, QUOTA.shape, key))
        return value
    finally:
        await client.aclose()


async def snapshot(shard: Shard) -> dict[bytes | str, bytes]:
    client = aioredis.Redis(port=shard.redis.port)
    try:
        return {key: await client.dump(key) or b"" for key in sorted(await client.keys("*"))}
    finally:
        await client.aclose()


async def test_a_batch_by_an_older_epoch_applies_nothing_and_is_moved(
    redis_servers: list[RedisProcess], tmp_path: Path
) -> None:
    async with shard_endpoints(redis_servers[0], tmp_path) as shard:
        a, b = shard.urls
        for url in (a, b):
            assert await shard.push(url, 1) == (200, {"epoch": 1})
        first = await shard.batch(b, [check("k")])
        assert first.epoch == 1 and isinstance(first.results[0], wire.Checked)
        assert first.results[0].allowed and first.results[0].limits[0].remaining == 4
        assert await used(shard, "k") == b"1:0"

        assert await shard.push(a, 2) == (200, {"epoch": 2})  # to A only
        assert (await shard.stats(b))["epoch"] == 1
        before = await snapshot(shard)
        # Over HTTP, the way run_batch() goes.
        reply = await shard.batch(b, [check("k"), check("other")])
        assert reply.results == [wire.Moved(2), wire.Moved(2)]
        assert reply.epoch == 2
        assert await snapshot(shard) == before
        assert await used(shard, "k") == b"1:0" and await used(shard, "other") is None
        assert (await shard.stats(b))["epoch"] == 2

        assert await shard.push(a, 3) == (200, {"epoch": 3})
        before = await snapshot(shard)
        # On the channel, placed by the layout B has: start_batch()'s callbacks.
        layout = shard.topology(2).layout_id
        reply = await shard.channel_batch(b, [check("k")], layout)
        assert reply.results == [wire.Moved(3)]
        assert await snapshot(shard) == before
        assert (await shard.stats(b))["epoch"] == 3

        # B serves again, by the shard's epoch.
        again = await shard.batch(b, [check("k")])
        assert isinstance(again.results[0], wire.Checked)
        assert again.results[0].allowed and again.results[0].limits[0].remaining == 3
        assert await used(shard, "k") == b"2:0"


async def test_a_push_older_than_the_shard_is_refused_and_the_shards_taken(
    redis_servers: list[RedisProcess], tmp_path: Path
) -> None:
    async with shard_endpoints(redis_servers[0], tmp_path) as shard:
        a, b = shard.urls
        assert await shard.push(a, 1) == (200, {"epoch": 1})
        assert await shard.push(b, 1) == (200, {"epoch": 1})
        assert await shard.push(a, 3) == (200, {"epoch": 3})
        status, body = await shard.push(b, 2)
        assert status == 409 and body["type"].endswith("stale-epoch")
        assert (await shard.stats(b))["epoch"] == 3
        client = aioredis.Redis(port=shard.redis.port)
        try:
            assert await client.get(SHARD_EPOCH_KEY) == b"3"
        finally:
            await client.aclose()


async def test_an_endpoint_that_comes_back_serves_by_the_shards_epoch(
    redis_servers: list[RedisProcess], tmp_path: Path
) -> None:
    async with shard_endpoints(redis_servers[0], tmp_path) as shard:
        a, b = shard.urls
        assert await shard.push(a, 1) == (200, {"epoch": 1})
        assert await shard.push(b, 1) == (200, {"epoch": 1})
        shard.endpoints[1].kill()
        assert await shard.push(a, 4) == (200, {"epoch": 4})
        await shard.endpoints[1].start_async()
        assert (await shard.stats(b))["epoch"] == 4


async def test_a_refund_and_a_quota_restock_by_an_older_epoch_apply_nothing(
    redis_servers: list[RedisProcess], tmp_path: Path
) -> None:
    async with shard_endpoints(redis_servers[0], tmp_path) as shard:
        a, b = shard.urls
        for url in (a, b):
            assert await shard.push(url, 1) == (200, {"epoch": 1})
        limits = [QUOTA.to_wire()]
        recorded = wire.Op("check", "k", SCOPE, limits, [0], 2, "r1", record_ttl_ms=60_000)
        first = await shard.batch(b, [recorded])
        assert isinstance(first.results[0], wire.Checked) and first.results[0].allowed
        assert await used(shard, "k") == b"2:0"

        assert await shard.push(a, 2) == (200, {"epoch": 2})
        before = await snapshot(shard)
        refund = wire.Op("refund", "k", SCOPE, limits, [0], request_id="r1")
        restock = wire.Op("adjust", "k", SCOPE, limits, [0], request_id="a1", adjust=[1, 3, 0, 0])
        reply = await shard.batch(b, [refund, restock])
        assert reply.results == [wire.Moved(2), wire.Moved(2)]
        assert await snapshot(shard) == before
        assert (await shard.stats(b))["epoch"] == 2

        # By the shard's epoch, the refund gives back exactly what the check took.
        again = await shard.batch(b, [refund])
        assert again.results == [wire.Refunded(wire.RefundStatus.REFUNDED, [(2, 0)])]
        assert await used(shard, "k") == b"0:0"


async def test_a_migration_call_to_an_endpoint_behind_its_shard_is_served(
    redis_servers: list[RedisProcess], tmp_path: Path
) -> None:
    async with shard_endpoints(redis_servers[0], tmp_path) as shard:
        a, b = shard.urls
        for url in (a, b):
            assert await shard.push(url, 1) == (200, {"epoch": 1})
        assert await shard.push(a, 2, migration="m1") == (200, {"epoch": 2})
        assert (await shard.stats(b))["epoch"] == 1
        imported = await shard.post(b, wire.IMPORT_PATH, {"migration": "m1", "entries": []})
        assert imported == (200, {"restored": 0, "received": 0})
        assert (await shard.stats(b))["epoch"] == 2
        status, _ = await shard.post(b, wire.IMPORT_PATH, {"migration": "m0", "entries": []})
        assert status == 409
