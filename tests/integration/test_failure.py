"""A node's Redis or the node itself goes away: affected checks degrade, others don't."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from cluster.local.redis_proc import RedisProcess, free_port
from cluster.web.problem import problem_body, problem_detail
from node.edge.boundary import redis_failure
from node.health.redis_stats import redis_problem, unready_because
from node.store.reply_errors import write_refusal
from tests.conftest import (
    ADMIN,
    RULES,
    Cluster,
    add_spare_node,
    eventually,
    start_cluster,
    stop_cluster,
)

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


async def test_a_full_or_evicting_redis_is_named_and_refuses_checks(cluster: Cluster) -> None:
    """A full Redis (noeviction): its checks answer degraded `refused`, consuming nothing;
    its node and the routers are not ready, saying why; /v1/cluster names it for the
    shard. An evicting policy is named too."""
    direct = redis.Redis(port=cluster.redis[0].port)
    quota = {"algorithm": "fixed_window", "limit": 5, "window": "3660d"}

    async def problem_of_n1() -> Any:
        status, info = await cluster.get("/v1/cluster")
        assert status == 200
        return {node["id"]: node["redis_problem"] for node in info["nodes"]}["n1"]

    async def node_ready() -> tuple[int, Any]:
        async with cluster.http.get(cluster.node_urls["n1"] + "/readyz") as resp:
            return resp.status, await resp.json(content_type=None)

    owner_n1 = next(f"oom:{i}" for i in range(500) if cluster.router.view.owner(f"oom:{i}") == "n1")
    try:
        assert await problem_of_n1() is None
        assert (await node_ready())[0] == 200
        used = int(direct.info("memory")["used_memory"])
        direct.config_set("maxmemory", used // 2)  # over it: every write is refused
        problem = await problem_of_n1()
        assert problem.startswith("full: used_memory ") and problem.endswith("(OOM)"), problem
        _, body = await cluster.check({"key": owner_n1, "limits": [quota]})
        assert body["degraded"] is True and body["allowed"] is True, body  # fail open
        assert body["degraded_reason"] == (
            "refused: the shard's Redis is full (used memory over maxmemory, policy "
            "noeviction): it refused the write, and nothing was consumed"
        )
        assert (
            cluster.router.metrics.count("shardlimit_degraded_decisions_total", reason="refused")
            == 1
        )
        status, ready = await node_ready()
        assert (status, ready["type"].rsplit("/", 1)[-1]) == (503, "redis-refuses-writes")
        assert ready["detail"].startswith("node n1's Redis: full: used_memory "), ready
        status, ready = await cluster.get("/readyz")
        assert status == 503 and ready["nodes"]["n1"] == "down", ready
        assert "full: used_memory" in ready["why"]["n1"] and set(ready["why"]) == {"n1"}
        direct.config_set("maxmemory-policy", "allkeys-lru")
        assert "maxmemory-policy allkeys-lru" in await problem_of_n1()
        assert (await node_ready())[0] == 200  # evicting: it takes writes (and warns)
    finally:
        direct.config_set("maxmemory", 0)
        direct.config_set("maxmemory-policy", "noeviction")
        direct.close()
    assert await problem_of_n1() is None
    assert (await cluster.get("/readyz"))[0] == 200
    _, body = await cluster.check({"key": owner_n1, "limits": [quota], "cost": 0})
    assert body["limits"][0]["remaining"] == 5, body  # the refused check consumed nothing


def test_a_failed_aof_write_is_a_redis_problem() -> None:
    memory = {"used_memory": 10, "maxmemory": 0, "maxmemory_policy": "noeviction"}
    assert redis_problem(memory, {"aof_last_write_status": "ok"}) is None
    assert "AOF write failed" in str(redis_problem(memory, {"aof_last_write_status": "err"}))


async def test_a_redis_that_cannot_persist_refuses_writes_and_is_not_ready(
    tmp_path: Path,
) -> None:
    """A Redis told to save snapshots whose last one failed refuses writes and even PING
    (MISCONF): readiness says why, and a script's refusal is told from other errors."""
    server = RedisProcess(
        port=free_port(), data_dir=tmp_path, aof=False, extra_args=["--dbfilename", "x.rdb"]
    )
    server.start()
    client = aioredis.Redis(port=server.port)
    try:
        assert await unready_because(client) is None
        await client.config_set("save", "3600 1")
        await client.config_set("stop-writes-on-bgsave-error", "yes")
        (tmp_path / "x.rdb").mkdir()  # the snapshot cannot take its name
        await client.bgsave()

        async def failed() -> bool:
            info = await client.info("persistence")
            return bool(info["rdb_last_bgsave_status"] == "err")

        await eventually(failed)
        why = await unready_because(client)
        assert why is not None and why.startswith("refusing writes: MISCONF "), why
        with pytest.raises(redis.exceptions.ResponseError) as refused:
            await client.eval("return redis.call('set', KEYS[1], 1)", 1, "k")
        assert write_refusal(refused.value) == ("cannot persist (its last AOF or RDB write failed)")
        assert write_refusal(redis.exceptions.ResponseError("WRONGTYPE Operation")) is None
        (tmp_path / "x.rdb").rmdir()
        await client.bgsave()
        await eventually(lambda: _not(failed))
        assert await unready_because(client) is None
    finally:
        await client.aclose()
        server.stop()


async def _not(condition: Callable[[], Awaitable[bool]]) -> bool:
    return not await condition()


async def test_a_node_over_a_full_redis_is_refused_as_a_member(
    cluster: Cluster, fourth_redis: RedisProcess
) -> None:
    """Joining would move keys into a Redis that refuses them: refused, saying why."""
    n4_url = await add_spare_node(cluster, fourth_redis)
    direct = redis.Redis(port=fourth_redis.port)
    try:
        direct.config_set("maxmemory", int(direct.info("memory")["used_memory"]) // 2)
        status, body = await cluster.post("/v1/cluster/nodes", {"url": n4_url, "id": "n4"}, ADMIN)
    finally:
        direct.config_set("maxmemory", 0)
        direct.close()
    assert status == 422 and body["type"].endswith("/node-unreachable"), body
    assert "node n4's Redis: full: used_memory " in body["detail"], body
    assert (await cluster.get("/v1/cluster"))[1]["epoch"] == 1  # nothing changed


def test_a_redis_failure_is_answered_saying_what_it_is() -> None:
    oom = redis.exceptions.OutOfMemoryError(
        "command not allowed when used memory > 'maxmemory'. script: 9b28, on @user_script:6."
    )
    assert redis_failure("n4", oom) == (
        "redis-refuses-writes",
        "node n4's Redis is full (used memory over maxmemory, policy noeviction): "
        "it refused the write",
    )
    lost = redis.exceptions.ConnectionError("connection to Redis lost: closed")
    assert redis_failure("n4", lost) == (
        "redis-unavailable",
        "node redis unavailable: connection to Redis lost: closed",
    )
    answer = problem_body(503, "redis-refuses-writes", "node n4's Redis is full")
    assert problem_detail(answer) == "node n4's Redis is full"
    assert problem_detail(b"<html>502</html>") == "<html>502</html>"
