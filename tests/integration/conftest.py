"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cluster.local.ports import free_port
from cluster.local.redis_proc import RedisProcess
from cluster.local.sentinel_proc import replica_of, wait_for


@pytest.fixture
def primary_and_replica(tmp_path: Path) -> Iterator[tuple[RedisProcess, RedisProcess]]:
    """A primary and its replica, in sync."""
    primary = RedisProcess(free_port(), tmp_path / "primary", aof=False)
    replica = replica_of(primary, free_port(avoid={primary.port}), tmp_path / "replica")
    primary.start()
    replica.start()
    client = redis.Redis(port=primary.port)

    def online() -> bool:
        info = client.info("replication")
        return bool(info.get("connected_slaves")) and info["slave0"]["state"] == "online"

    wait_for(online, 30, "the replica is in sync")
    client.close()
    yield primary, replica
    replica.stop()
    primary.stop()
