"""Leases under load and under change: hundreds of acquirers in another process never
hold more than the limit at once and reuse every freed slot; a key's held leases move
with it when a node joins or leaves (ring and slots), where renew and release still
find them and fencing goes on from where it was."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from cluster.local.redis_proc import RedisProcess
from cluster.model.keys import counter_key
from cluster.model.nodes import NodeSpec
from tests.conftest import (
    ADMIN,
    Cluster,
    add_spare_node,
    cluster_with_rules,
    eventually,
    start_cluster,
    stop_cluster,
)
from tests.support.lease_load import most_held_at_once, report_of, start_load

RULES = """
rules:
  exports:
    limits:
      - {algorithm: concurrency, limit: 5, lease: 10m}
"""
cluster = cluster_with_rules(RULES)


async def lease_load(cluster: Cluster, key: str, workers: int, rounds: int) -> dict[str, Any]:
    """tests/support/lease_load.py in a child process; its report."""
    return await report_of(await started_load(cluster, key, workers, rounds))


async def started_load(
    cluster: Cluster, key: str, workers: int, rounds: int
) -> asyncio.subprocess.Process:
    return await start_load(cluster.router_url, "exports", key, workers, rounds)


@pytest.mark.timeout(120)
async def test_hundreds_of_acquirers_never_hold_more_than_the_limit(cluster: Cluster) -> None:
    workers, rounds = 300, 1
    report = await lease_load(cluster, "tenant:1", workers, rounds)
    assert report["errors"] == []
    leases = report["leases"]
    assert len(leases) == workers * rounds
    assert all(lease["acquired_at_ms"] <= lease["released_at_ms"] for lease in leases)
    assert most_held_at_once(leases) == 5
    # Every freed slot was taken again: one fencing value per lease granted, none lost
    # to a slot that stayed empty, and nothing is held once they all released.
    assert sorted(lease["fencing"] for lease in leases) == list(range(1, workers * rounds + 1))
    assert report["denials"] > 0
    usage = await cluster.usage("tenant:1", "exports")
    assert usage["limits"][0]["held"] == 0 and usage["limits"][0]["remaining"] == 5
    print(f"{len(leases)} leases in {report['seconds']} s, {report['denials']} denials")


def test_the_overlap_count_sees_an_overlap() -> None:
    leases = [
        {"acquired_at_ms": 10, "released_at_ms": 20},
        {"acquired_at_ms": 20, "released_at_ms": 30},  # takes the slot freed at 20
        {"acquired_at_ms": 15, "released_at_ms": 25},
    ]
    assert most_held_at_once(leases) == 2
    assert most_held_at_once([*leases, {"acquired_at_ms": 19, "released_at_ms": 21}]) == 3


@pytest.fixture(params=["ring", "slots"])
async def growing(
    request: pytest.FixtureRequest,
    redis_servers: list[RedisProcess],
    fourth_redis: RedisProcess,
    tmp_path: Path,
) -> AsyncIterator[tuple[Cluster, str]]:
    started = await start_cluster(
        redis_servers, tmp_path, partitioner=request.param, rules_yaml=RULES
    )
    n4_url = await add_spare_node(started, fourth_redis)
    try:
        yield started, n4_url
    finally:
        await stop_cluster(started)


async def migrated(cluster: Cluster) -> None:
    async def done() -> bool:
        _, info = await cluster.get("/v1/cluster")
        migration = info["migration"]
        if migration and migration.get("last_error"):
            raise AssertionError(migration["last_error"])
        return bool(migration and migration.get("phase") == "done" and not migration["running"])

    await eventually(done, within=90)


async def post(cluster: Cluster, path: str, key: str, lease_id: str) -> tuple[int, Any]:
    return await cluster.post(path, {"key": key, "rule": "exports", "lease_id": lease_id})


@pytest.mark.timeout(150)
async def test_held_leases_move_with_their_key_when_a_node_joins_or_leaves(
    growing: tuple[Cluster, str],
) -> None:
    cluster, n4_url = growing
    keys = [f"tenant:{i}" for i in range(120)]
    held: dict[str, dict[str, Any]] = {}
    for key in keys:
        _, first = await cluster.check({"key": key, "rule": "exports"})
        assert (await post(cluster, "/v1/lease/release", key, first["lease"]["id"]))[0] == 200
        status, body = await cluster.check({"key": key, "rule": "exports"})
        assert status == 200 and body["lease"]["fencing"] == 2
        held[key] = body["lease"]
    before = {key: cluster.router.view.owner(key) for key in keys}
    status, _ = await cluster.post("/v1/cluster/nodes", {"url": n4_url, "id": "n4"}, ADMIN)
    assert status in (200, 202)
    await migrated(cluster)
    moved = [key for key in keys if cluster.router.view.owner(key) == "n4"]
    assert moved and all(before[key] != "n4" for key in moved)
    n4 = aioredis.Redis(port=cluster.redis[3].port)
    try:
        for key in moved:  # the leases' key is on the new node's Redis now
            name = counter_key("exports", "cc", key)
            assert await n4.zscore(name, "f") == -2.0
    finally:
        await n4.aclose()
    for key in keys:
        lease_id = held[key]["id"]
        status, renewed = await post(cluster, "/v1/lease/renew", key, lease_id)
        assert status == 200 and renewed["lease"]["fencing"] == 2, (key, renewed)
        usage = await cluster.usage(key, "exports")
        assert usage["limits"][0]["held"] == 1
        assert (await post(cluster, "/v1/lease/release", key, lease_id))[0] == 200
        status, body = await cluster.check({"key": key, "rule": "exports"})
        assert status == 200 and body["lease"]["fencing"] == 3, (key, body)
        held[key] = body["lease"]
    # n2 leaves: its keys, and the leases they hold, move to the other nodes.
    leaving = [key for key in keys if cluster.router.view.owner(key) == "n2"]
    async with cluster.http.delete(
        cluster.router_url + "/v1/cluster/nodes/n2", headers={"Authorization": f"Bearer {ADMIN}"}
    ) as resp:
        assert resp.status == 202, await resp.text()
    await migrated(cluster)
    assert leaving and all(cluster.router.view.owner(key) != "n2" for key in leaving)
    for key in leaving:
        lease_id = held[key]["id"]
        assert (await post(cluster, "/v1/lease/renew", key, lease_id))[0] == 200
        assert (await post(cluster, "/v1/lease/release", key, lease_id))[0] == 200
        status, body = await cluster.check({"key": key, "rule": "exports"})
        assert status == 200 and body["lease"]["fencing"] == 4, (key, body)


@pytest.mark.timeout(180)
async def test_acquirers_under_load_stay_exact_while_their_key_moves(
    growing: tuple[Cluster, str],
) -> None:
    """A key under lease load moves to a joining node: never more than the limit held at
    once across both nodes, one fencing value per grant, in the order of the grants."""
    cluster, n4_url = growing
    joining = NodeSpec("n4", n4_url)
    after = cluster.router.view.topology.partitioner.resized(
        [*cluster.router.view.topology.nodes, joining]
    )
    key = next(k for k in (f"hot:{i}" for i in range(1000)) if after.owner(k) == "n4")
    _, first = await cluster.check({"key": key, "rule": "exports"})  # held through the move
    metrics = cluster.router.metrics
    load = await started_load(cluster, key, workers=150, rounds=3)

    async def flowing() -> bool:
        return metrics.count("shardlimit_lease_events_total", event="acquired") >= 40

    await eventually(flowing, within=60)
    status, _ = await cluster.post("/v1/cluster/nodes", {"url": n4_url, "id": "n4"}, ADMIN)
    assert status in (200, 202)
    await migrated(cluster)
    assert load.returncode is None  # the key moved while the acquirers were at work
    report = await report_of(load)
    assert cluster.router.view.owner(key) == "n4"
    assert report["errors"] == []
    status, released = await post(cluster, "/v1/lease/release", key, first["lease"]["id"])
    assert status == 200
    held_first = {
        "fencing": 1,
        "acquired_at_ms": first["lease"]["acquired_at_ms"],
        "released_at_ms": released["released_at_ms"],
    }
    leases = [held_first, *report["leases"]]
    assert len(leases) == 1 + 150 * 3
    assert most_held_at_once(leases) <= 5
    by_fencing = sorted(leases, key=lambda lease: lease["fencing"])
    assert len({lease["fencing"] for lease in leases}) == len(leases)
    grants = [lease["acquired_at_ms"] for lease in by_fencing]
    assert grants == sorted(grants)  # fencing grows with every grant, across the move
    _, last = await cluster.check({"key": key, "rule": "exports"})
    assert last["lease"]["fencing"] > by_fencing[-1]["fencing"]
