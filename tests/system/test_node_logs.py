"""A node whose Redis is down says so, without repeating the same warning 4 times a
second: identical warnings pass once per window, the next one counts those held back."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import redis

from cluster.local.cluster import node_process
from cluster.local.ports import free_port
from cluster.local.redis_proc import RedisProcess
from tests.conftest import eventually

SWEEP = "lease could not be taken, will retry"


@pytest.mark.timeout(60)
async def test_a_node_with_its_redis_down_rate_limits_its_warnings(tmp_path: Path) -> None:
    log = tmp_path / "node.log"
    env = dict(os.environ, SHARDLIMIT_CLUSTER_TOKEN="t", SHARDLIMIT_LOG_REPEAT_S="1")
    dead_redis = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    node = node_process("n1", free_port(), dead_redis, log=log, env=env)
    await node.start_async()
    try:

        def sweep_lines() -> list[str]:
            return [line for line in log.read_text().splitlines() if SWEEP in line]

        async def summarised_twice() -> bool:
            return sum("repeated" in line for line in sweep_lines()) >= 2

        await eventually(summarised_twice, within=30)
    finally:
        node.stop()
    lines = sweep_lines()
    # A plain redis:// URL: no replicas, which the node says once, at start.
    no_replicas = [line for line in log.read_text().splitlines() if "has no replicas" in line]
    assert len(no_replicas) == 1 and "WARNING" in no_replicas[0], no_replicas
    assert "`durability: replica` rules are served as primary" in no_replicas[0]
    assert "repeated" not in lines[0]
    held = [re.search(r"\(repeated (\d+) more times in \d+ s\)$", line) for line in lines[1:]]
    assert all(held), lines  # never the same warning twice in a row without a count
    # The sweeper's lease is tried every 1/3 s: a 1 s window holds back about 2 of each 3.
    assert all(int(match.group(1)) >= 2 for match in held if match), lines


@pytest.mark.timeout(60)
async def test_a_node_over_an_evicting_redis_says_so_at_start(tmp_path: Path) -> None:
    """Such a Redis, once full, evicts counters: their limits start again from zero."""
    server = RedisProcess(free_port(), tmp_path / "redis", aof=False)
    server.start()
    client = redis.Redis(port=server.port)
    log = tmp_path / "node.log"
    try:
        client.config_set("maxmemory-policy", "allkeys-lru")
        env = dict(os.environ, SHARDLIMIT_CLUSTER_TOKEN="t")
        node = node_process("n1", free_port(), server.url, log=log, env=env)
        await node.start_async()
        try:

            def said() -> list[str]:
                return [line for line in log.read_text().splitlines() if "evicts" in line]

            async def logged() -> bool:
                return bool(said())

            await eventually(logged, within=30)
        finally:
            node.stop()
        [line] = said()
        assert "ERROR" in line and "maxmemory-policy allkeys-lru" in line, line
        assert "set maxmemory-policy noeviction" in line
    finally:
        client.close()
        server.stop()
