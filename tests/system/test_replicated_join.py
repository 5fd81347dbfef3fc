"""A node whose Redis is a Sentinel-watched primary with a replica joins a replicated
cluster (`POST /v1/cluster/nodes`): its keys move to it, its `durability: replica`
checks are acknowledged once its replica holds them, and `GET /v1/cluster` shows its
primary and replica."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from cluster.local.cluster import node_process, scratch_cluster
from cluster.local.ports import free_port
from cluster.local.redis_proc import RedisProcess
from cluster.local.sentinel_proc import sentinel_master, wait_for
from tests.conftest import eventually
from tests.system.replication import check, key_on

pytestmark = [pytest.mark.system, pytest.mark.timeout(150)]
ADMIN = "replicated-join-admin-token"
STOCK = [{"algorithm": "quota", "limit": 1000}]  # durability replica by default


async def test_a_node_with_a_replica_joins_and_serves_replica_rules(tmp_path: Any) -> None:
    with scratch_cluster(2, admin_token=ADMIN, data_dir=tmp_path / "c", replicas=1) as local:
        replication = local.replication
        assert replication is not None
        primary = RedisProcess(free_port(avoid=replication.taken), tmp_path / "n3-primary")
        replication.taken.add(primary.port)
        node = None
        try:
            primary.start()
            url = replication.add("n3", primary)  # its replica, and the node's URL
            for replica in replication.shards["n3"]:
                replica.start()
            replication.monitor_new_shards()
            wait_for(
                lambda: (
                    sentinel_master(replication.sentinels, "n3") == (primary.host, primary.port)
                ),
                10,
                "the Sentinels watch n3",
            )
            port = free_port(avoid=replication.taken)
            node = node_process("n3", port, url, env=local.env(), log=tmp_path / "n3.log")
            node.spawn()
            node.wait_ready(30)
            node_url = f"http://127.0.0.1:{port}"
            async with aiohttp.ClientSession() as http:
                headers = {"Authorization": f"Bearer {ADMIN}"}
                body = {"url": node_url, "id": "n3"}
                async with http.post(
                    local.router_url + "/v1/cluster/nodes", json=body, headers=headers
                ) as resp:
                    assert resp.status in (200, 202), await resp.text()

                async def moved() -> bool:
                    async with http.get(local.router_url + "/v1/cluster") as resp:
                        info = await resp.json()
                    migration = info["migration"] or {}
                    return migration.get("phase") == "done" and not migration.get("running")

                await eventually(moved, within=60)
                key = await key_on(http, local.router_url, "n3", "sku")
                answers: list[dict[str, Any]] = []

                async def replicated() -> bool:
                    # Until the new replica's first sync is done, no replica acknowledges
                    # in time: degraded, `unreplicated`, consuming nothing.
                    answers.append(await check(http, local.router_url, key, STOCK))
                    return not answers[-1].get("degraded")

                await eventually(replicated, within=30)
                for answer in answers[:-1]:
                    assert answer["degraded_reason"].startswith("unreplicated"), answer
                served = [answers[-1]] + [
                    await check(http, local.router_url, key, STOCK) for _ in range(2)
                ]
                for answer, expected in zip(served, (999, 998, 997), strict=True):
                    assert answer["node"] == "n3", answer
                    assert not answer.get("degraded"), answer
                    assert answer["limits"][0]["remaining"] == expected, answer
                async with http.get(local.router_url + "/v1/cluster") as resp:
                    nodes = {n["id"]: n for n in (await resp.json())["nodes"]}
                redis = nodes["n3"]["redis"]
                replica = replication.shards["n3"][0]
                assert redis["replicated"] is True, redis
                assert redis["primary"] == f"{primary.host}:{primary.port}", redis
                assert [(r["addr"], r["up"]) for r in redis["replicas"]] == [
                    (f"{replica.host}:{replica.port}", True)
                ], redis
        finally:
            if node is not None:
                node.terminate()
                node.wait_stopped(10)
            primary.stop()
