"""A copy step's chunk to a target's Redis (node/migration/direct.py), on real
redis-servers: each key read here (PTTL, DUMP), RESTOREd there with its expiry, never
over a key the target holds, and dropped here once the target holds it; a key the
target refuses otherwise stays here; an address that is not a writable primary is told
apart."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import aiohttp
import pytest
import redis
import redis.asyncio as aioredis

from cluster.local.ports import free_port
from cluster.local.redis_proc import RedisProcess
from node.migration.copy_step import MOVE_CHUNK
from node.migration.direct import DirectMover
from node.migration.peer_client import PeerClient, RedisAddress
from node.migration.peer_redis import PeerRedis
from node.store.redispy_pipe import own_sender
from tests.conftest import CLUSTER
from tests.support.node_app import node_on_port

pytestmark = pytest.mark.timeout(60)

HOUR_MS = 3_600_000


@pytest.fixture
async def mover(redis_servers: list[RedisProcess]) -> AsyncIterator[DirectMover]:
    client = aioredis.Redis(port=redis_servers[0].port)
    peers = PeerClient(aiohttp.ClientSession, cluster_token=None)
    peer_redis = PeerRedis(peers)
    sender = own_sender(client)
    moving = DirectMover(peers, peer_redis, sender)
    yield moving
    await sender.close()
    await peer_redis.close()
    await client.aclose()


def _address(server: RedisProcess) -> RedisAddress:
    return (server.host, server.port, 0)


async def test_a_chunk_lands_with_its_expiry_and_a_key_the_target_holds_is_left_as_it_is_there(
    mover: DirectMover, redis_servers: list[RedisProcess]
) -> None:
    source, target = (redis.Redis(port=s.port) for s in redis_servers[:2])
    names = [f"c12345678|user:{i}" for i in range(150)]
    for i, name in enumerate(names):
        source.set(name, i + 1, px=HOUR_MS)
    source.set("c12345678|forever", 7)  # no expiry
    target.set(names[3], 1000, px=HOUR_MS)  # pulled on first touch and counted since
    refused = await mover.copy_chunk(
        _address(redis_servers[1]), [*names, "c12345678|forever"], keep=False
    )
    assert refused == []
    held = [int(value or 0) for value in target.mget(names)]
    assert held == [1000 if i == 3 else i + 1 for i in range(150)]
    assert target.get("c12345678|forever") == b"7" and target.pttl("c12345678|forever") == -1
    assert all(0 < target.pttl(name) <= HOUR_MS for name in names)
    assert source.keys("c12345678|*") == []  # the target holds every one


async def test_keys_a_target_refuses_for_another_reason_stay_here(
    mover: DirectMover, redis_servers: list[RedisProcess]
) -> None:
    source, target = (redis.Redis(port=s.port) for s in redis_servers[:2])
    names = [f"c12345678|user:{i}" for i in range(20)]
    for name in names:
        source.set(name, 4, px=HOUR_MS)
    target.config_set("maxmemory", 1)  # every RESTORE refused: OOM
    try:
        refused = await mover.copy_chunk(_address(redis_servers[1]), names, keep=False)
    finally:
        target.config_set("maxmemory", 0)
    assert refused == names
    assert [int(value or 0) for value in source.mget(names)] == [4] * 20
    assert target.keys("c12345678|*") == []


async def test_a_kept_chunk_stays_here_and_a_key_gone_meanwhile_is_skipped(
    mover: DirectMover, redis_servers: list[RedisProcess]
) -> None:
    source, target = (redis.Redis(port=s.port) for s in redis_servers[:2])
    source.set("c12345678|a", 5, px=HOUR_MS)
    refused = await mover.copy_chunk(
        _address(redis_servers[1]), ["c12345678|a", "c12345678|gone"], keep=True
    )
    assert refused == []
    assert target.get("c12345678|a") == b"5" and target.exists("c12345678|gone") == 0
    assert source.get("c12345678|a") == b"5"  # kept until the target's replica has it


async def test_no_writable_primary_at_the_address_is_told_and_nothing_is_dropped(
    mover: DirectMover,
    redis_servers: list[RedisProcess],
    primary_and_replica: tuple[RedisProcess, RedisProcess],
) -> None:
    source = redis.Redis(port=redis_servers[0].port)
    source.set("c12345678|a", 5, px=HOUR_MS)
    _, replica = primary_and_replica
    assert await mover.copy_chunk(_address(replica), ["c12345678|a"], keep=False) is None
    nobody: RedisAddress = ("127.0.0.1", free_port(), 0)
    assert await mover.copy_chunk(nobody, ["c12345678|a"], keep=False) is None
    assert source.get("c12345678|a") == b"5"


async def test_after_a_kept_copy_to_a_target_without_a_replica_barrier_the_keys_it_holds_are_dropped(
    mover: DirectMover, redis_servers: list[RedisProcess]
) -> None:
    """A target of an older version answers the landed call 404: its Redis is asked,
    through the copy's own connection to it, which keys it holds."""
    source, target = (redis.Redis(port=s.port) for s in redis_servers[:2])
    names = [f"c12345678|user:{i}" for i in range(6)]
    for name in names:
        source.set(name, 3, px=HOUR_MS)
    target.set(names[0], 3, px=HOUR_MS)
    target.set(names[4], 9, px=HOUR_MS)
    left = await mover._drop_if_there(_address(redis_servers[1]), names)
    assert left == [names[1], names[2], names[3], names[5]]
    assert sorted(source.keys("c12345678|*")) == sorted(name.encode() for name in left)
    nobody: RedisAddress = ("127.0.0.1", free_port(), 0)
    assert await mover._drop_if_there(nobody, left) == left  # not known there: all stay
    assert len(source.keys("c12345678|*")) == 4


async def test_a_move_to_a_replicated_target_whose_address_is_lost_lists_each_key_left_once(
    redis_servers: list[RedisProcess],
) -> None:
    """Keys the target refused in an earlier chunk are still here, like every key of a
    move kept for a replica barrier: when a later chunk finds no writable primary, each
    key here is handed back once, for the import endpoint."""
    source, target = (redis.Redis(port=s.port) for s in redis_servers[:2])
    names = [f"c12345678|user:{i}" for i in range(MOVE_CHUNK + 2)]
    for name in names:
        source.set(name, 4, px=HOUR_MS)
    # The second chunk starts with a RESTORE (of random bytes: DUMP cannot compress them)
    # over the target's longest argument, a protocol error: the target drops the
    # connection, and the chunk's next reply never comes.
    source.set(names[MOVE_CHUNK], os.urandom(1_200_000), px=HOUR_MS)
    client = aioredis.Redis(port=redis_servers[0].port)
    peers = PeerClient(aiohttp.ClientSession, cluster_token=CLUSTER)
    peer_redis = PeerRedis(peers)
    sender = own_sender(client)
    try:
        async with node_on_port(redis_servers[1].url, "n2") as url:
            target.config_set("maxmemory", 1)  # the first chunk's RESTOREs refused: OOM
            target.config_set("proto-max-bulk-len", 1_048_576)
            left = await DirectMover(peers, peer_redis, sender).move((url,), names)
    finally:
        target.config_set("maxmemory", 0)
        target.config_set("proto-max-bulk-len", 512 * 1_048_576)
        await sender.close()
        await peer_redis.close()
        await client.aclose()
    assert left == names
    assert source.exists(*names) == len(names)
    assert target.keys("c12345678|*") == []
