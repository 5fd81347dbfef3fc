"""A `durability: replica` WAIT asks for every replica of the shard the Sentinels could
promote, not for one: Sentinel may promote any of them. On a real primary with two replicas
and three real Sentinels."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from cluster.local.ports import free_port
from cluster.local.redis_proc import RedisProcess
from cluster.local.sentinel_proc import Replication, ask, sentinel_master, wait_for
from node.store.connect import redis_client, sentinel_replicas
from node.store.counter_store import ReplicaAcks
from node.store.replica_presence import ReplicaPresence, listed_replicas

pytestmark = pytest.mark.timeout(90)


@dataclass
class Shard:
    primary: RedisProcess
    replication: Replication
    url: str  # redis+sentinel://

    @property
    def replicas(self) -> list[RedisProcess]:
        return self.replication.shards["n1"]


@pytest.fixture
def shard(tmp_path: Path) -> Iterator[Shard]:
    primary = RedisProcess(free_port(), tmp_path / "primary", aof=False)
    replication = Replication(tmp_path, replicas=2, taken={primary.port})
    url = replication.add("n1", primary)
    primary.start()
    replication.start()
    yield Shard(primary, replication, url)
    for sentinel in replication.sentinels:
        sentinel.stop()
    for process in (*replication.shards["n1"], primary):
        process.resume()
        process.stop()


@contextlib.asynccontextmanager
async def _counting(shard: Shard) -> AsyncIterator[tuple[aioredis.Redis, ReplicaPresence]]:
    """A node's client of the shard's primary, and its count of the replicas a WAIT asks
    for, kept up to date until the block ends."""
    client = redis_client(shard.url, socket_timeout=5.0)
    presence = ReplicaPresence(client)
    presence.start()
    try:
        yield client, presence
    finally:
        await presence.close()
        await client.aclose()


async def _write(client: aioredis.Redis, acks: ReplicaAcks, value: int = 0) -> None:
    """One write and the batch's WAIT, on one connection, as the node sends them."""
    pipe = client.pipeline(transaction=False)
    for command in acks.commands([("RPUSH", "sl|acks", value)]):
        pipe.execute_command(*command)
    acks.note(await pipe.execute())


async def _until(condition: Callable[[], bool], within: float) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "not within the bound"
        await asyncio.sleep(0.05)


async def _answered(
    read: Callable[[], Awaitable[dict[str, bool] | None]], tries: int = 20
) -> dict[str, bool]:
    """What the Sentinels say, asked until one answers (None: none did this time)."""
    for _ in range(tries):
        known = await read()
        if known is not None:
            return known
    raise AssertionError(f"no Sentinel answered in {tries} reads")


async def test_a_stopped_replica_is_waited_for_until_sentinel_sees_it_down(
    shard: Shard,
) -> None:
    async with _counting(shard) as (client, presence):
        await _until(lambda: presence.needed == 2, 10)
        acks = ReplicaAcks(500, presence.needed)
        await _write(client, acks)
        assert (acks.missing, acks.acked) == (False, 2)

        shard.replicas[1].pause()  # one replica stops acknowledging
        acks = ReplicaAcks(300, presence.needed)
        await _write(client, acks)
        # One replica holds the write, but the other might be the one promoted.
        assert (acks.missing, acks.acked) == (True, 1)
        presence.fell_short(acks.acked)
        assert not presence.absent  # primary-durability checks are not held up
        await _until(lambda: presence.needed == 1, 10)  # the Sentinels see it down
        acks = ReplicaAcks(500, presence.needed)
        await _write(client, acks)
        assert (acks.missing, acks.acked) == (False, 1)

        shard.replicas[1].resume()
        await _until(lambda: presence.needed == 2, 10)
        acks = ReplicaAcks(500, presence.needed)
        await _write(client, acks)
        assert (acks.missing, acks.acked) == (False, 2)


async def test_a_primary_being_failed_over_acknowledges_nothing_the_new_one_lacks(
    shard: Shard,
) -> None:
    """SENTINEL FAILOVER of a live primary: the promoted replica leaves it first, while
    the other still follows it. Every write it acknowledged is on the new primary."""
    sentinel_client = redis_client(shard.url)
    presence = ReplicaPresence(sentinel_client)
    presence.start()
    old = aioredis.Redis(host=shard.primary.host, port=shard.primary.port)
    acknowledged: list[int] = []
    try:
        await _until(lambda: presence.needed == 2, 10)
        sentinel = shard.replication.sentinels[0]
        sentinel_redis = aioredis.Redis(host=sentinel.address[0], port=sentinel.address[1])
        assert await sentinel_redis.execute_command("SENTINEL", "FAILOVER", "n1")  # type: ignore[no-untyped-call]
        await sentinel_redis.aclose()
        before = (shard.primary.host, shard.primary.port)
        value = 0
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            value += 1
            acks = ReplicaAcks(100, presence.needed)
            try:
                await _write(old, acks, value)
            except RedisError:  # READONLY: demoted
                break
            if not acks.missing:
                acknowledged.append(value)
            else:
                presence.fell_short(acks.acked)
        wait_for(
            lambda: sentinel_master(shard.replication.sentinels, "n1") not in (None, before),
            20,
            "the promotion",
        )
        promoted = sentinel_master(shard.replication.sentinels, "n1")
        assert promoted is not None
        new = aioredis.Redis(host=promoted[0], port=promoted[1])
        held = {int(v) for v in await new.lrange("sl|acks", 0, -1)}
        await new.aclose()
        assert acknowledged, "nothing was acknowledged before the failover began"
        assert [v for v in acknowledged if v not in held] == []
    finally:
        await presence.close()
        await sentinel_client.aclose()
        await old.aclose()


def _entries(shard: Shard, address: tuple[str, int]) -> list[dict[str, Any]]:
    """Each Sentinel's SENTINEL REPLICAS entry for the replica at `address`."""
    found = []
    for sentinel in shard.replication.sentinels:
        client = redis.Redis(host=sentinel.host, port=sentinel.port, socket_timeout=0.5)
        try:
            replicas = client.sentinel_slaves("n1")
        except redis.RedisError:
            continue
        finally:
            client.close()
        found += [r for r in replicas if (r["ip"], r["port"]) == address]
    return found


async def test_a_replica_no_sentinel_has_read_is_not_waited_for(shard: Shard) -> None:
    """At a switch each Sentinel makes a new entry for every replica. One whose process
    does not answer (stopped here; a restarting Redis does the same) shows neither down
    nor disconnected until `down-after`, the connection being open, but Sentinel never
    promotes a replica it has not read: it is not counted among those WAIT asks for."""
    client = redis_client(shard.url, socket_timeout=5.0)
    first, second = shard.replicas
    address = (second.host, second.port)
    try:
        # The stopped replica must not be the one promoted.
        assert ask(second.host, second.port, "CONFIG", "SET", "replica-priority", "0") == b"OK"
        wait_for(
            lambda: (
                bool(_entries(shard, address))
                and all(r["slave-priority"] == 0 for r in _entries(shard, address))
            ),
            20,
            "the Sentinels reading the priority",
        )
        both = {f"{first.host}:{first.port}": True, f"{second.host}:{second.port}": True}
        # A Sentinel answers within 0.25 s or not at all: on a loaded machine, a read
        # may find none answering (None). Asked again, not waited on a clock.
        assert await _answered(lambda: sentinel_replicas(client)) == both
        second.pause()
        sentinel = shard.replication.sentinels[0]
        assert ask(sentinel.host, sentinel.port, "SENTINEL", "FAILOVER", "n1") == b"OK"

        def only_unread_and_up() -> bool:
            """Some Sentinel's new entry shows it up, and every Sentinel that shows it
            up has not read it (the leader keeps the entry it read until the failover
            ends, and marks it down after `down-after`)."""
            up = [
                r for r in _entries(shard, address) if not (r["is_sdown"] or r["is_disconnected"])
            ]
            return bool(up) and not any(r["runid"] for r in up)

        wait_for(only_unread_and_up, 20, "the Sentinels' new entries for the stopped replica")
        known = await _answered(lambda: sentinel_replicas(client))
        assert known[f"{second.host}:{second.port}"] is False
    finally:
        second.resume()
        await client.aclose()


def _state_at_primary(shard: Shard, replica: RedisProcess) -> str | None:
    """The replica's state in the primary's INFO replication, None when not listed."""
    client = redis.Redis(host=shard.primary.host, port=shard.primary.port, socket_timeout=0.5)
    try:
        info = client.info("replication")
    finally:
        client.close()
    listed = listed_replicas(info).get(f"{replica.host}:{replica.port}")
    return None if listed is None else str(listed["state"])


async def test_a_replica_taking_the_dataset_is_not_waited_for_until_it_has_it(
    shard: Shard,
) -> None:
    """A replica in a full sync acknowledges nothing until it ends: WAIT asks for the
    replicas that can answer, so durable checks are not answered degraded meanwhile,
    and for it again once it is online."""
    second = shard.replicas[1]
    primary = (shard.primary.host, shard.primary.port)
    async with _counting(shard) as (client, presence):
        await _until(lambda: presence.needed == 2, 10)
        # The primary holds a replica that asks for the dataset until told to send it.
        for setting in (("repl-diskless-sync", "yes"), ("repl-diskless-sync-delay", 300)):
            assert ask(*primary, "CONFIG", "SET", *setting) == b"OK"
        # A replica that was a primary, however briefly, has a history of its own: it
        # cannot continue the stream, and takes the whole dataset again.
        assert ask(second.host, second.port, "REPLICAOF", "NO", "ONE") == b"OK"
        assert ask(second.host, second.port, "REPLICAOF", *primary) == b"OK"
        wait_for(
            lambda: _state_at_primary(shard, second) not in (None, "online"),
            20,
            "the replica asking for the dataset",
        )
        await _until(lambda: presence.needed == 1, 10)
        acks = ReplicaAcks(500, presence.needed)
        await _write(client, acks, 1)
        assert (acks.missing, acks.acked) == (False, 1)
        assert _state_at_primary(shard, second) not in (None, "online")

        assert ask(*primary, "CONFIG", "SET", "repl-diskless-sync-delay", 0) == b"OK"
        wait_for(lambda: _state_at_primary(shard, second) == "online", 20, "the sync")
        await _until(lambda: presence.needed == 2, 10)
        acks = ReplicaAcks(2000, presence.needed)
        await _write(client, acks, 2)
        assert (acks.missing, acks.acked) == (False, 2)
        replica = aioredis.Redis(host=second.host, port=second.port)
        assert await replica.lrange("sl|acks", 0, -1) == [b"1", b"2"]
        await replica.aclose()


async def test_a_replica_away_from_the_primary_is_not_waited_for_until_it_is_back(
    shard: Shard,
) -> None:
    """A replica whose link to the primary is down (here: pointed at an address where
    nothing listens; a restarting one is the same until it connects) acknowledges
    nothing: once the Sentinels have read it so, WAIT asks for the replicas that can
    answer, and for it again once the Sentinels read it following the primary."""
    second = shard.replicas[1]
    address = f"{second.host}:{second.port}"
    async with _counting(shard) as (client, presence):
        await _until(lambda: presence.needed == 2, 10)
        assert ask(second.host, second.port, "REPLICAOF", "127.0.0.1", free_port()) == b"OK"

        async def waited_for() -> bool | None:
            known = await sentinel_replicas(client)
            return None if known is None else known.get(address)

        deadline = time.monotonic() + 30
        while await waited_for() is not False:  # a Sentinel reads a replica every 10 s
            assert time.monotonic() < deadline, "no Sentinel read the replica's link down"
            await asyncio.sleep(0.1)
        assert any(
            r["runid"] and not r["is_sdown"] for r in _entries(shard, (second.host, second.port))
        )
        await _until(lambda: presence.needed == 1, 10)
        acks = ReplicaAcks(500, presence.needed)
        await _write(client, acks, 1)
        assert (acks.missing, acks.acked) == (False, 1)

        primary = (shard.primary.host, shard.primary.port)
        assert ask(second.host, second.port, "REPLICAOF", *primary) == b"OK"
        await _until(lambda: presence.needed == 2, 20)
        acks = ReplicaAcks(2000, presence.needed)
        await _write(client, acks, 2)
        assert (acks.missing, acks.acked) == (False, 2)
