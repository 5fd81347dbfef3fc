"""A node whose Redis is a Sentinel-watched primary with a replica (`redis+sentinel://`)
follows a failover with no operator step: its keys answer degraded, consuming nothing,
while the primary is down, then normally from the promoted replica, with every count
the replica had acknowledged."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import pytest
import redis

from cluster.local.cluster import scratch_cluster
from cluster.local.sentinel_proc import sentinel_master
from tests.conftest import eventually

pytestmark = [pytest.mark.system, pytest.mark.timeout(120)]
ADMIN = "failover-admin-token"
STOCK = [{"algorithm": "quota", "limit": 1000}]  # no window: nothing rolls over meanwhile


async def _check(http: aiohttp.ClientSession, router: str, key: str) -> dict[str, Any]:
    body = {"key": key, "limits": STOCK}
    async with http.post(router + "/v1/check", json=body) as resp:
        answer: dict[str, Any] = await resp.json()
        return answer


async def _key_on(http: aiohttp.ClientSession, router: str, node: str) -> str:
    for i in range(1000):
        async with http.get(f"{router}/v1/locate?key=sku:{i}") as resp:
            if (await resp.json())["node"] == node:
                return f"sku:{i}"
    raise AssertionError(f"no key of 1,000 on {node}")


async def test_a_killed_primary_is_followed_to_its_promoted_replica(tmp_path: Any) -> None:
    with scratch_cluster(2, admin_token=ADMIN, data_dir=tmp_path / "c", replicas=1) as local:
        assert local.replication is not None
        async with aiohttp.ClientSession() as http:
            key = await _key_on(http, local.router_url, "n1")
            for _ in range(5):
                answer = await _check(http, local.router_url, key)
                assert answer["allowed"] is True and not answer.get("degraded"), answer
            primary = local.redis[0]
            replica = local.replication.shards["n1"][0]
            writer = redis.Redis(host=primary.host, port=primary.port)
            assert writer.wait(1, 5000) == 1  # the replica holds the 5 admitted
            writer.close()

            primary.kill()
            killed = time.monotonic()
            admitted_after = 0
            degraded = 0

            async def served() -> bool:
                nonlocal admitted_after, degraded
                answer = await _check(http, local.router_url, key)
                if answer.get("degraded"):
                    degraded += 1
                    return False
                assert answer["allowed"] is True, answer
                admitted_after += 1
                return True

            await eventually(served, within=30)
            print(f"first normal answer {time.monotonic() - killed:.2f} s after the kill")
            sentinels = local.replication.sentinels
            assert sentinel_master(sentinels, "n1") == (replica.host, replica.port)
            answer = await _check(http, local.router_url, key)
            assert answer["limits"][0]["remaining"] == 1000 - 5 - admitted_after - 1
            assert degraded >= 1  # the primary's death was seen, and consumed nothing
