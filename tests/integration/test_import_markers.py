"""A migration's import markers (node/migration/migrator.py, import.lua and
import_revert.lua) on a real redis-server: each imported key is marked once, the marks
are listed in the migration's marker index, and dropping them after the migration takes
exactly those, without a SCAN of the keyspace, leaving every other key and migration."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
import redis.asyncio as aioredis

from cluster.local.redis_proc import RedisProcess
from cluster.model.keys import marker_index_key, marker_key
from node.migration.entries import ExportEntry
from node.migration.migrator import MARKER_TTL_MS, Migrator
from node.migration.peer_client import PeerClient

pytestmark = pytest.mark.timeout(60)

HOUR_MS = 3_600_000


@pytest.fixture
async def migrator(redis_servers: list[RedisProcess]) -> AsyncIterator[Migrator]:
    client = aioredis.Redis(port=redis_servers[0].port)
    await client.flushall()
    moving = Migrator(client, PeerClient(aiohttp.ClientSession, cluster_token=None))
    yield moving
    await moving.sender.close()
    await moving.peer_redis.close()
    await client.aclose()


async def _entries(client: aioredis.Redis, names: list[str]) -> list[ExportEntry]:
    """Entries as a source exports them: each name's DUMP of a count of 3."""
    (seconds, micros) = await client.time()
    now_ms = seconds * 1000 + micros // 1000
    entries: list[ExportEntry] = []
    for name in names:
        await client.set(name, 3, px=HOUR_MS)
        dump = await client.dump(name)
        assert dump is not None
        entries.append((name, dump, now_ms + HOUR_MS, True))
    await client.delete(*names)
    return entries


async def _scans(client: aioredis.Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_scan", {}).get("calls", 0))


async def test_markers_are_indexed_per_migration_and_dropped_without_a_scan(
    migrator: Migrator,
) -> None:
    client = migrator.client
    await client.mset({f"c12345678|other:{i}": 1 for i in range(1_000)})
    imported = [f"c12345678|user:{i}" for i in range(30)]
    entries = await _entries(client, imported)
    assert await migrator.import_entries("m1", entries) == 30
    assert await migrator.import_entries("m1", entries) == 0  # marked: nothing twice
    handed_back = [f"c12345678|user:{i}" for i in range(40, 45)]
    assert await migrator.import_entries("m2", await _entries(client, handed_back), replace=True)
    index = marker_index_key("m1")
    assert await client.smembers(index) == {marker_key("m1", k).encode() for k in imported}
    assert 0 < await client.pttl(index) <= MARKER_TTL_MS
    assert await client.dbsize() == 1_000 + 30 + 30 + 1 + 5 + 5 + 1

    scans = await _scans(client)
    assert await migrator.drop_markers("m1") == 30
    assert await _scans(client) == scans  # what was marked, not a scan of every key
    assert await client.exists(index, *(marker_key("m1", k) for k in imported)) == 0
    assert await client.dbsize() == 1_000 + 30 + 5 + 5 + 1  # the keys and m2's marks stay
    assert await migrator.drop_markers("m1") == 0
    assert await migrator.drop_markers("m2") == 5
    assert await client.dbsize() == 1_000 + 30 + 5
    assert await client.mget(imported) == [b"3"] * 30
