"""Counters survive a Redis crash: AOF with appendfsync always loses nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.local.redis_proc import RedisProcess, free_port
from tests.conftest import Cluster, eventually, start_cluster, stop_cluster

PAYMENTS = {
    "algorithm": "calendar",
    "period": "month",
    "timezone": "Europe/Paris",
    "max_count": 1000,
    "max_amount": "1000000.00",
}


@pytest.fixture
def aof_redis(tmp_path: Path) -> Iterator[list[RedisProcess]]:
    servers = [
        RedisProcess(port=free_port(), data_dir=tmp_path / f"aof{i}", appendfsync="always")
        for i in range(3)
    ]
    for server in servers:
        server.start()
    yield servers
    for server in servers:
        server.stop()


@pytest.mark.timeout(90)
async def test_sigkilled_redis_keeps_calendar_counts_and_amounts(
    aof_redis: list[RedisProcess], tmp_path: Path
) -> None:
    cluster: Cluster = await start_cluster(aof_redis, tmp_path)
    try:
        keys = [f"merchant:{i}" for i in range(60)]
        for n, key in enumerate(keys):
            for _ in range(n % 4 + 1):
                status, _ = await cluster.check(
                    {"key": key, "limits": [PAYMENTS], "amount": "12.34"}
                )
                assert status == 200
        for server in aof_redis:
            server.kill()  # SIGKILL: no shutdown, no final fsync
            server.start()

        async def back() -> bool:
            results = [
                await cluster.check({"key": key, "limits": [PAYMENTS], "cost": 0}) for key in keys
            ]
            return not any(body["degraded"] for _, body in results)

        await eventually(back, within=20)
        for n, key in enumerate(keys):
            _, body = await cluster.check({"key": key, "limits": [PAYMENTS], "cost": 0})
            hits = n % 4 + 1
            assert body["limits"][0]["remaining"] == 1000 - hits, key
            left = 100_000_000 - hits * 1234
            assert body["limits"][0]["amount_remaining"] == f"{left // 100}.{left % 100:02d}"
    finally:
        await stop_cluster(cluster)
