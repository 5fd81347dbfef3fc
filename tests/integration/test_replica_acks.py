"""A `durability: replica` WAIT asks for every live replica of the shard, not for one:
Sentinel may promote any of them. On a real primary with two replicas."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from cluster.local.ports import free_port
from cluster.local.redis_proc import RedisProcess
from cluster.local.sentinel_proc import replica_of, wait_for
from node.store.counter_store import ReplicaAcks
from node.store.replica_presence import ReplicaPresence, live_replicas

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def shard(tmp_path: Path) -> Iterator[tuple[RedisProcess, list[RedisProcess]]]:
    """A primary and two replicas, in sync."""
    primary = RedisProcess(free_port(), tmp_path / "primary", aof=False)
    first = replica_of(primary, free_port(avoid={primary.port}), tmp_path / "r1")
    second = replica_of(primary, free_port(avoid={primary.port, first.port}), tmp_path / "r2")
    for process in (primary, first, second):
        process.start()
    client = redis.Redis(port=primary.port)
    wait_for(lambda: live_replicas(client.info("replication")) == 2, 30, "both replicas sync")
    client.close()
    yield primary, [first, second]
    for process in (second, first, primary):
        process.resume()
        process.stop()


async def _write(client: aioredis.Redis, acks: ReplicaAcks) -> None:
    """One write and the batch's WAIT, on one connection, as the node sends them."""
    pipe = client.pipeline(transaction=False)
    for command in acks.commands([("INCR", "sl|acks")]):
        pipe.execute_command(*command)
    acks.note(await pipe.execute())


async def _until(condition: object, within: float) -> None:
    deadline = time.monotonic() + within
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not within the bound"
        await asyncio.sleep(0.05)


async def test_a_stopped_replica_makes_the_wait_fall_short_until_it_is_recounted(
    shard: tuple[RedisProcess, list[RedisProcess]],
) -> None:
    primary, (_, second) = shard
    client = aioredis.Redis(port=primary.port)
    presence = ReplicaPresence(client)
    presence.start()
    try:
        await _until(lambda: presence.needed == 2, 5)
        acks = ReplicaAcks(500, presence.needed)
        await _write(client, acks)
        assert (acks.missing, acks.acked) == (False, 2)

        second.pause()  # one replica stops acknowledging
        acks = ReplicaAcks(300, presence.needed)
        await _write(client, acks)
        # One replica holds the write, but the other might be the one promoted.
        assert (acks.missing, acks.acked) == (True, 1)
        presence.fell_short(acks.acked)
        assert not presence.absent  # primary-durability checks are not held up
        await _until(lambda: presence.needed == 1, 5)  # once its lag passes a second
        acks = ReplicaAcks(500, presence.needed)
        await _write(client, acks)
        assert (acks.missing, acks.acked) == (False, 1)

        second.resume()
        await _until(lambda: presence.needed == 2, 5)
        acks = ReplicaAcks(500, presence.needed)
        await _write(client, acks)
        assert (acks.missing, acks.acked) == (False, 2)
    finally:
        await presence.close()
        await client.aclose()


async def test_no_replica_acknowledging_marks_the_shard_without_replicas(
    shard: tuple[RedisProcess, list[RedisProcess]],
) -> None:
    primary, replicas = shard
    client = aioredis.Redis(port=primary.port)
    presence = ReplicaPresence(client)
    try:
        for replica in replicas:
            replica.pause()
        acks = ReplicaAcks(200, 1)
        await _write(client, acks)
        assert (acks.missing, acks.acked) == (True, 0)
        presence.fell_short(acks.acked)
        assert presence.absent
        for replica in replicas:
            replica.resume()
        await _until(lambda: not presence.absent, 5)
    finally:
        await presence.close()
        await client.aclose()
