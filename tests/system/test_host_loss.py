"""A shard served from several hosts: each shard has two node processes (endpoints) and
three Redis (a primary and two replicas under 3 Sentinels). Losing a whole host, the node
process the router sends to and the shard's primary Redis killed together, is routed
around: the router moves to the other endpoint, Sentinel promotes a replica, the endpoint
follows it, and the shard's keys answer normally again within 3 s. Nothing acknowledged
under `durability: replica` is lost: what each key holds afterwards is exactly what the
load, from another process, was told was admitted."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from cluster.local.cluster import scratch_cluster
from tests.support.check_load import checks_report, start_checks
from tests.system.replication import key_on

pytestmark = [pytest.mark.system, pytest.mark.timeout(180)]
ADMIN = "host-loss-admin"
LIMIT = 1_000_000
RULE = {"limits": [{"algorithm": "quota", "limit": LIMIT}], "durability": "replica"}
NORMAL_WITHIN_S = 3.0


async def _used(http: aiohttp.ClientSession, router: str, key: str) -> int:
    async with http.get(f"{router}/v1/usage?key={key}&rule=stock") as resp:
        answer = await resp.json()
    assert not answer.get("degraded"), answer.get("degraded_reason")
    return LIMIT - int(answer["limits"][0]["remaining"])


async def _endpoints(http: aiohttp.ClientSession, router: str, node: str) -> list[dict[str, Any]]:
    async with http.get(router + "/v1/cluster") as resp:
        nodes = {n["id"]: n for n in (await resp.json())["nodes"]}
    endpoints: list[dict[str, Any]] = nodes[node]["endpoints"]
    return endpoints


async def test_a_whole_host_killed_is_routed_around_within_3_s(tmp_path: Path) -> None:
    with scratch_cluster(
        2, admin_token=ADMIN, data_dir=tmp_path / "c", replicas=2, endpoints=2
    ) as local:
        router = local.router_url
        async with aiohttp.ClientSession() as http:
            headers = {"Authorization": f"Bearer {ADMIN}"}
            async with http.put(f"{router}/v1/rules/stock", json=RULE, headers=headers) as resp:
                assert resp.status in (200, 201), await resp.text()
            lost = [await key_on(http, router, "n1", f"sku{i}") for i in range(4)]
            kept = [await key_on(http, router, "n2", f"sku{i}") for i in range(2)]
            before = await _endpoints(http, router, "n1")
            assert [e["active"] for e in before] == [True, False], before
            assert [e["state"] for e in before] == ["up", "up"], before

            load = await start_checks(router, "stock", lost + kept, workers=6, seconds=9)
            deadline = time.monotonic() + 30
            while not await _used(http, router, lost[0]):
                assert time.monotonic() < deadline, "no check admitted under the load"
                await asyncio.sleep(0.05)  # polling for the load's first admission
            await asyncio.sleep(1.5)  # the load runs normally for a while before the loss
            local.endpoints[0][0].kill()  # the host: its node process and its Redis
            local.redis[0].kill()
            killed = time.monotonic()
            report = await checks_report(load)

            assert report["errors"] == []
            answers = report["answers"]
            on_lost = [a for a in answers if a[1] in lost]
            after = [a for a in on_lost if a[0] >= killed]
            degraded = [a for a in after if a[3]]
            assert after, "no check of the lost host's keys after the kill"
            last_degraded = max((a[0] for a in degraded), default=killed) - killed
            print(
                f"{len(after)} checks of the lost shard after the kill, {len(degraded)} "
                f"degraded, the last sent {last_degraded:.2f} s after it"
            )
            assert last_degraded <= NORMAL_WITHIN_S
            assert any(not a[3] for a in after if a[0] - killed > last_degraded)
            assert not any(a[3] for a in answers if a[1] in kept)  # the other shard never

            admitted = Counter(a[1] for a in answers if a[2] and not a[3])
            for key in lost + kept:
                assert await _used(http, router, key) == admitted[key], key

            now = await _endpoints(http, router, "n1")
            assert [e["active"] for e in now] == [False, True], now
            assert now[0]["state"] == "down" and now[1]["state"] == "up", now
