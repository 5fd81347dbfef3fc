"""Endpoints of a shard, added and removed live: `node add --id n1 URL` adds a node
process started as n1 on n1's Redis as another endpoint of n1 (no key moves), a process of
another shard or of an empty Redis is refused, and `node remove n1 --url URL` takes one
endpoint out while the shard and its counts stay. With two endpoints, the one the router
sends to can die: the other serves the shard's keys, with every count kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis as sync_redis

from cluster.local.cluster import LocalCluster, node_process, scratch_cluster
from cluster.local.ports import free_port
from cluster.local.procs import ChildProcess
from cluster.local.redis_proc import RedisProcess
from tests.conftest import eventually
from tests.system.replication import key_on

pytestmark = [pytest.mark.system, pytest.mark.timeout(120)]
ADMIN = "endpoints-admin"
HEADERS = {"Authorization": f"Bearer {ADMIN}"}
RATE = [{"algorithm": "fixed_window", "limit": 1000, "window": "3660d"}]


def _endpoint(local: LocalCluster, node_id: str, redis_url: str) -> tuple[ChildProcess, str]:
    port = free_port()
    child = node_process(
        node_id, port, redis_url, log=local.data_dir / "logs" / f"{port}.log", env=local.env()
    )
    child.start(30)
    return child, f"http://127.0.0.1:{port}"


async def _cluster(http: aiohttp.ClientSession, router: str) -> dict[str, Any]:
    async with http.get(router + "/v1/cluster") as resp:
        info: dict[str, Any] = await resp.json()
    return info


async def _settled(http: aiohttp.ClientSession, router: str) -> dict[str, Any]:
    """/v1/cluster once the membership change in progress is over."""
    found: dict[str, Any] = {}

    async def done() -> bool:
        info = await _cluster(http, router)
        migration = info["migration"]
        assert not (migration or {}).get("last_error"), migration
        if migration and (migration.get("phase") != "done" or migration.get("running")):
            return False
        found.update(info)
        return True

    await eventually(done, within=60)
    return found


async def _remaining(http: aiohttp.ClientSession, router: str, key: str) -> int:
    async with http.post(router + "/v1/check", json={"key": key, "limits": RATE}) as resp:
        answer = await resp.json()
    assert resp.status == 200 and not answer.get("degraded"), answer
    return int(answer["limits"][0]["remaining"])


async def test_an_endpoint_added_serves_when_the_first_dies_and_is_removed_again(
    tmp_path: Path,
) -> None:
    with scratch_cluster(2, admin_token=ADMIN, data_dir=tmp_path / "c") as local:
        router = local.router_url
        second, second_url = _endpoint(local, "n1", local.redis[0].url)
        stranger, stranger_url = _endpoint(local, "n2", local.redis[1].url)
        try:
            async with aiohttp.ClientSession() as http:
                key = await key_on(http, router, "n1", "user")
                for used in range(1, 4):
                    assert await _remaining(http, router, key) == 1000 - used

                # A process of n2's shard is not an endpoint of n1; an endpoint twice neither.
                body = {"id": "n1", "url": stranger_url}
                async with http.post(
                    router + "/v1/cluster/nodes", json=body, headers=HEADERS
                ) as resp:
                    assert resp.status == 409, await resp.text()
                    assert (await resp.json())["type"].endswith("endpoint-not-of-shard")
                body = {"id": "n1", "url": local.node_url(0)}
                async with http.post(
                    router + "/v1/cluster/nodes", json=body, headers=HEADERS
                ) as resp:
                    assert resp.status == 409, await resp.text()

                body = {"id": "n1", "url": second_url}
                async with http.post(
                    router + "/v1/cluster/nodes", json=body, headers=HEADERS
                ) as resp:
                    assert resp.status == 202, await resp.text()
                info = await _settled(http, router)
                assert info["migration"]["keys_moved"] == 0, info["migration"]
                n1 = next(n for n in info["nodes"] if n["id"] == "n1")
                urls = [e["url"] for e in n1["endpoints"]]
                assert urls == [local.node_url(0), second_url], n1
                assert [e["active"] for e in n1["endpoints"]] == [True, False]

                local.nodes[0].kill()

                async def served() -> bool:
                    async with http.post(
                        router + "/v1/check", json={"key": key, "limits": RATE}
                    ) as resp:
                        answer = await resp.json()
                    return not answer.get("degraded")

                await eventually(served, within=10)
                used = 4  # the degraded checks consumed nothing
                assert await _remaining(http, router, key) == 1000 - used - 1
                n1 = next(n for n in (await _cluster(http, router))["nodes"] if n["id"] == "n1")
                assert [e["active"] for e in n1["endpoints"]] == [False, True], n1

                path = f"/v1/cluster/nodes/n1?url={local.node_url(0)}"
                async with http.delete(router + path, headers=HEADERS) as resp:
                    assert resp.status == 202, await resp.text()
                info = await _settled(http, router)
                n1 = next(n for n in info["nodes"] if n["id"] == "n1")
                assert n1["url"] == second_url and len(n1["endpoints"]) == 1, n1
                assert await _remaining(http, router, key) == 1000 - used - 2
                path = f"/v1/cluster/nodes/n1?url={second_url}"
                async with http.delete(router + path, headers=HEADERS) as resp:
                    assert resp.status == 409, await resp.text()
                    assert (await resp.json())["type"].endswith("last-endpoint")
        finally:
            second.stop()
            stranger.stop()


STOCK = [{"algorithm": "quota", "limit": 1000}]
KEYS = [f"sku:{i}" for i in range(3000)]
# Slow enough to interrupt: a step examines 50 keys, the copy moves 150 keys/s.
SLOW_COPY = {"reshard_step_keys": 50, "reshard_rate": 150}


async def _fill(http: aiohttp.ClientSession, router: str) -> dict[str, int]:
    used = {key: 1 + index % 3 for index, key in enumerate(KEYS)}
    for start in range(0, len(KEYS), 500):
        checks = [{"key": k, "limits": STOCK, "cost": used[k]} for k in KEYS[start : start + 500]]
        async with http.post(router + "/v1/check/batch", json={"checks": checks}) as resp:
            body = await resp.json()
        assert resp.status == 200, body
        assert all(r["allowed"] and not r.get("degraded") for r in body["results"]), body
    return used


async def test_a_migration_whose_copying_endpoint_dies_completes_from_the_other(
    tmp_path: Path,
) -> None:
    with scratch_cluster(
        3, admin_token=ADMIN, data_dir=tmp_path / "c", endpoints=2, router_settings=SLOW_COPY
    ) as local:
        router = local.router_url
        async with aiohttp.ClientSession() as http:
            used = await _fill(http, router)
            # Removing n3 moves its keys to n1 and n2: n3's endpoint copies them.
            async with http.delete(router + "/v1/cluster/nodes/n3", headers=HEADERS) as resp:
                assert resp.status == 202, await resp.text()

            async def midway() -> bool:
                migration = (await _cluster(http, router))["migration"] or {}
                return int(migration.get("keys_moved", 0)) >= 150

            await eventually(midway, within=30)
            assert (await _cluster(http, router))["migration"]["phase"] == "copying"
            local.endpoints[2][0].kill()
            resumed = 0

            async def done() -> bool:
                nonlocal resumed
                migration = (await _cluster(http, router))["migration"] or {}
                if migration.get("phase") == "done" and not migration.get("running"):
                    return True
                if migration and not migration.get("running"):  # paused: a step failed 5 times
                    resumed += 1
                    async with http.post(
                        router + "/v1/cluster/migration/resume", headers=HEADERS
                    ) as resp:
                        assert resp.status == 202, await resp.text()
                return False

            await eventually(done, within=90)
            info = await _cluster(http, router)
            assert [n["id"] for n in info["nodes"]] == ["n1", "n2"], info["nodes"]
            print(f"{info['migration']['keys_moved']} keys moved, {resumed} resumes")
            for start in range(0, len(KEYS), 500):
                chunk = KEYS[start : start + 500]
                checks = [{"key": k, "limits": STOCK, "cost": 0} for k in chunk]
                async with http.post(router + "/v1/check/batch", json={"checks": checks}) as resp:
                    body = await resp.json()
                for key, result in zip(chunk, body["results"], strict=True):
                    assert not result.get("degraded"), (key, result)
                    assert result["limits"][0]["remaining"] == 1000 - used[key], key
            # Nothing is left on n3's Redis: every counter moved exactly once.
            leftover = sync_redis.Redis(port=local.redis[2].port)
            try:
                assert [k for k in leftover.scan_iter(match="c*", count=1000)] == []
            finally:
                leftover.close()


async def test_the_only_shard_loses_an_endpoint_but_not_itself(tmp_path: Path) -> None:
    """One shard of two endpoints: `node remove n1 --url` takes the second out; removing n1
    itself is refused as the last node."""
    with scratch_cluster(1, admin_token=ADMIN, data_dir=tmp_path / "c") as local:
        router = local.router_url
        second, second_url = _endpoint(local, "n1", local.redis[0].url)
        try:
            async with aiohttp.ClientSession() as http:
                body = {"id": "n1", "url": second_url}
                async with http.post(
                    router + "/v1/cluster/nodes", json=body, headers=HEADERS
                ) as resp:
                    assert resp.status == 202, await resp.text()
                await _settled(http, router)
                out = f"{router}/v1/cluster/nodes/n1?url={second_url}"
                async with http.delete(out, headers=HEADERS) as resp:
                    assert resp.status == 202, await resp.text()
                info = await _settled(http, router)
                [n1] = info["nodes"]
                assert n1["url"] == local.node_url(0) and len(n1.get("endpoints") or []) < 2
                async with http.delete(f"{router}/v1/cluster/nodes/n1", headers=HEADERS) as resp:
                    assert resp.status == 409
                    assert (await resp.json())["type"].endswith("/last-node")
        finally:
            second.stop()


async def test_a_node_added_without_an_id_joins_under_the_id_it_was_started_with(
    tmp_path: Path,
) -> None:
    with scratch_cluster(2, admin_token=ADMIN, data_dir=tmp_path / "c") as local:
        router = local.router_url
        spare = RedisProcess(port=free_port(), data_dir=tmp_path / "spare-redis")
        spare.start()
        extra, extra_url = _endpoint(local, "edge-7", spare.url)
        try:
            async with aiohttp.ClientSession() as http:
                plan = {"url": extra_url, "dry_run": True}
                async with http.post(
                    router + "/v1/cluster/nodes", json=plan, headers=HEADERS
                ) as resp:
                    planned = await resp.json()
                assert resp.status == 200, planned
                assert {m["target"] for m in planned["moves"]} == {"edge-7"}, planned
                assert planned["refused"] is None, planned
                async with http.post(
                    router + "/v1/cluster/nodes", json={"url": extra_url}, headers=HEADERS
                ) as resp:
                    assert resp.status == 202, await resp.text()
                info = await _settled(http, router)
                assert [n["id"] for n in info["nodes"]] == ["n1", "n2", "edge-7"]
        finally:
            extra.stop()
            spare.stop()
