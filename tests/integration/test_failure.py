"""A node's Redis or the node itself goes away: affected checks degrade, others don't."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis

from cluster.local.redis_proc import RedisProcess
from node.health.redis_stats import redis_problem
from tests.conftest import RULES, Cluster, eventually, start_cluster, stop_cluster

CALENDAR = {"algorithm": "calendar", "period": "day", "timezone": "UTC", "max_count": 100}
WINDOW = {"algorithm": "fixed_window", "limit": 100, "window": "1m"}


@pytest.fixture
async def fast_cluster(redis_servers: list[RedisProcess], tmp_path: Path) -> AsyncIterator[Cluster]:
    # The default node deadline, as in production.
    started = await start_cluster(redis_servers, tmp_path, node_deadline_ms=1000, rules_yaml=RULES)
    try:
        yield started
    finally:
        await stop_cluster(started)


def keys_by_node(cluster: Cluster, per_node: int) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {n: [] for n in cluster.node_urls}
    i = 0
    while any(len(v) < per_node for v in out.values()):
        key = f"f:{i}"
        owner = cluster.router.view.owner(key)
        if len(out[owner]) < per_node:
            out[owner].append(key)
        i += 1
    return out


async def test_dead_redis_degrades_only_its_keys_then_recovers(fast_cluster: Cluster) -> None:
    cluster = fast_cluster
    keys = keys_by_node(cluster, 5)
    victim = cluster.redis[0]  # n1's Redis
    victim.kill()
    for node, node_keys in keys.items():
        for key in node_keys:
            open_status, open_body = await cluster.check({"key": key, "limits": [WINDOW]})
            closed_status, closed_body = await cluster.check({"key": key, "limits": [CALENDAR]})
            if node == "n1":
                assert open_body["degraded"] is True and open_status == 200
                assert closed_body["degraded"] is True and closed_status == 429
            else:
                assert open_body["degraded"] is False and open_status == 200
                assert closed_body["degraded"] is False and closed_status == 200
    # The breaker is open now: answers for n1 do not wait on it at all.
    assert cluster.router.view.clients["n1"].state == "down"
    status, ready = await cluster.get("/readyz")
    assert status == 503 and ready["nodes"]["n1"] == "down"
    status, info = await cluster.get("/v1/cluster")
    assert {n["id"]: n["state"] for n in info["nodes"]}["n1"] == "down"

    victim.start()

    async def recovered() -> bool:
        _, body = await cluster.check({"key": keys["n1"][0], "limits": [WINDOW]})
        return body["degraded"] is False

    await eventually(recovered)
    status, _ = await cluster.get("/readyz")
    assert status == 200


async def test_dead_node_process_degrades_its_keys(fast_cluster: Cluster) -> None:
    cluster = fast_cluster
    keys = keys_by_node(cluster, 3)
    await cluster.runners[1].cleanup()  # node n2's HTTP server
    for node, node_keys in keys.items():
        for key in node_keys:
            status, body = await cluster.check({"key": key, "limits": [CALENDAR]})
            assert body["degraded"] is (node == "n2")
            assert status == (429 if node == "n2" else 200)
    # Rule-level on_failure overrides the default.
    key = keys["n2"][0]
    status, body = await cluster.check({"key": key, "limits": [CALENDAR], "on_failure": "allow"})
    assert status == 200 and body["degraded"] is True


async def test_full_node_queue_answers_overloaded_and_consumes_nothing(cluster: Cluster) -> None:
    """Backpressure: one batch in flight per node and at most 3 checks waiting; the rest
    are answered at once with on_failure, reason `overloaded`, and consume nothing."""
    for channel in cluster.router.view.clients.values():
        channel.max_inflight, channel.queue_max = 1, 3
    key = "burst:1"
    payload = {"key": key, "limits": [WINDOW]}
    results = await asyncio.gather(*(cluster.check(payload) for _ in range(60)))
    overloaded = [b for _, b in results if b["degraded"]]
    admitted = [b for _, b in results if b["allowed"] and not b["degraded"]]
    assert overloaded and admitted
    assert {b["degraded_reason"].split(":")[0] for b in overloaded} == {"overloaded"}
    assert all(status == 200 for status, b in results if b["degraded"])  # fixed_window: open
    owner = cluster.router.view.owner(key)
    assert cluster.router.view.clients[owner].overloaded == len(overloaded)
    degraded = cluster.router.metrics.count(
        "shardlimit_degraded_decisions_total", reason="overloaded"
    )
    assert degraded == len(overloaded)
    for channel in cluster.router.view.clients.values():
        channel.queue_max = 1000
    status, body = await cluster.check({**payload, "cost": 0})
    assert status == 200 and body["limits"][0]["remaining"] == 100 - len(admitted)


async def test_a_full_or_evicting_redis_is_named_in_the_cluster_view(cluster: Cluster) -> None:
    """Its checks answer degraded one by one; /v1/cluster says why once, for the shard."""
    direct = redis.Redis(port=cluster.redis[0].port)

    async def problem_of_n1() -> Any:
        status, info = await cluster.get("/v1/cluster")
        assert status == 200
        return {node["id"]: node["redis_problem"] for node in info["nodes"]}["n1"]

    try:
        assert await problem_of_n1() is None
        used = int(direct.info("memory")["used_memory"])
        direct.config_set("maxmemory", used // 2)  # over it: every write is refused
        problem = await problem_of_n1()
        assert problem.startswith("full: used_memory ") and problem.endswith("(OOM)"), problem
        owner_n1 = next(
            f"oom:{i}" for i in range(500) if cluster.router.view.owner(f"oom:{i}") == "n1"
        )
        _, body = await cluster.check({"key": owner_n1, "rule": "basic"})
        assert body["degraded"] is True, body
        direct.config_set("maxmemory-policy", "allkeys-lru")
        assert "maxmemory-policy allkeys-lru" in await problem_of_n1()
    finally:
        direct.config_set("maxmemory", 0)
        direct.config_set("maxmemory-policy", "noeviction")
        direct.close()
    assert await problem_of_n1() is None


def test_a_failed_aof_write_is_a_redis_problem() -> None:
    memory = {"used_memory": 10, "maxmemory": 0, "maxmemory_policy": "noeviction"}
    assert redis_problem(memory, {"aof_last_write_status": "ok"}) is None
    assert "AOF write failed" in str(redis_problem(memory, {"aof_last_write_status": "err"}))
