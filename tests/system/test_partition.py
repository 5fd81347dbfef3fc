"""A network partition of one endpoint of a shard, made with a network namespace: the
endpoint runs in its own namespace, joined to the host by a veth pair, and the partition
is the host's end of the pair set down. The router, which was sending the shard's checks
to that endpoint, moves to the shard's other endpoint and answers normally; when the link
comes back up the endpoint rejoins (it is up again in /v1/cluster). Every count is exact
throughout: what was sent to the partitioned endpoint and never answered was answered
degraded and applied nothing, then or later, so nothing is served twice."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis as sync_redis

from cluster.local.cluster import node_process, scratch_cluster
from cluster.local.ports import free_port
from tests.conftest import eventually
from tests.support.check_load import admitted, checks_report, start_checks
from tests.system.replication import key_on

pytestmark = [pytest.mark.system, pytest.mark.timeout(120)]
ADMIN = "partition-admin"
HEADERS = {"Authorization": f"Bearer {ADMIN}"}
LIMIT = 1_000_000
RATE = {"limits": [{"algorithm": "fixed_window", "limit": LIMIT, "window": "3660d"}]}
NAMESPACE = "sl-part"
HOST_END, AWAY_END = "sl-part0", "sl-part1"
HOST_IP, AWAY_IP = "10.231.7.1", "10.231.7.2"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@contextlib.contextmanager
def _namespace() -> Iterator[None]:
    """A network namespace joined to the host by a veth pair (HOST_IP <-> AWAY_IP)."""
    subprocess.run(["ip", "netns", "del", NAMESPACE], capture_output=True, timeout=10)
    subprocess.run(["ip", "link", "del", HOST_END], capture_output=True, timeout=10)
    _ip("netns", "add", NAMESPACE)
    try:
        _ip("link", "add", HOST_END, "type", "veth", "peer", "name", AWAY_END)
        _ip("link", "set", AWAY_END, "netns", NAMESPACE)
        _ip("addr", "add", f"{HOST_IP}/24", "dev", HOST_END)
        _ip("link", "set", HOST_END, "up")
        _ip("-n", NAMESPACE, "addr", "add", f"{AWAY_IP}/24", "dev", AWAY_END)
        _ip("-n", NAMESPACE, "link", "set", AWAY_END, "up")
        _ip("-n", NAMESPACE, "link", "set", "lo", "up")
        yield
    finally:
        subprocess.run(["ip", "link", "del", HOST_END], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", NAMESPACE], capture_output=True, timeout=10)


async def _cluster(http: aiohttp.ClientSession, router: str) -> dict[str, Any]:
    async with http.get(router + "/v1/cluster") as resp:
        info: dict[str, Any] = await resp.json()
    return info


async def _endpoints(http: aiohttp.ClientSession, router: str) -> dict[str, dict[str, Any]]:
    n1 = next(n for n in (await _cluster(http, router))["nodes"] if n["id"] == "n1")
    return {e["url"]: e for e in n1["endpoints"]}


async def _used(http: aiohttp.ClientSession, router: str, key: str) -> int:
    async with http.get(f"{router}/v1/usage?key={key}&rule=api") as resp:
        answer = await resp.json()
    assert not answer.get("degraded"), answer.get("degraded_reason")
    return LIMIT - int(answer["limits"][0]["remaining"])


async def test_a_partitioned_endpoint_is_routed_around_and_rejoins(tmp_path: Path) -> None:
    with _namespace(), scratch_cluster(2, admin_token=ADMIN, data_dir=tmp_path / "c") as local:
        router = local.router_url
        shard_redis = local.redis[0]
        # n1's Redis listens on the host's end of the pair too, for the namespaced endpoint.
        client = sync_redis.Redis(port=shard_redis.port)
        client.config_set("bind", f"127.0.0.1 {HOST_IP}")
        client.config_set("protected-mode", "no")  # a test network of this host only
        client.close()
        port = free_port()
        away = node_process(
            "n1",
            port,
            f"redis://{HOST_IP}:{shard_redis.port}/0",
            host=AWAY_IP,
            log=local.data_dir / "logs" / "node-n1-away.log",
            env=local.env(),
        )
        away.args = ["ip", "netns", "exec", NAMESPACE, *away.args]
        away_url = f"http://{AWAY_IP}:{port}"
        away.start(30)
        try:
            async with aiohttp.ClientSession() as http:
                body = {"id": "n1", "url": away_url}
                async with http.post(
                    router + "/v1/cluster/nodes", json=body, headers=HEADERS
                ) as resp:
                    assert resp.status == 202, await resp.text()

                async def added() -> bool:
                    return away_url in await _endpoints(http, router)

                await eventually(added, within=30)
                async with http.put(f"{router}/v1/rules/api", json=RATE, headers=HEADERS) as resp:
                    assert resp.status in (200, 201), await resp.text()
                # The router sends n1's checks to the namespaced endpoint: the first one
                # is stopped until the router moved, then goes on as the standby.
                local.nodes[0].pause()
                keys = [await key_on(http, router, "n1", f"user{i}") for i in range(3)]
                try:

                    async def moved_away() -> bool:
                        return bool((await _endpoints(http, router))[away_url]["active"])

                    async def poke() -> bool:
                        await _used_or_degraded(http, router, keys[0])
                        return await moved_away()

                    await eventually(poke, within=20)
                finally:
                    local.nodes[0].resume()

                async def first_back() -> bool:
                    return bool(
                        (await _endpoints(http, router))[local.node_url(0)]["state"] == "up"
                    )

                await eventually(first_back, within=20)
                before = {key: await _used(http, router, key) for key in keys}
                load = await start_checks(router, "api", keys, workers=4, seconds=7)
                deadline = time.monotonic() + 30
                while await _used(http, router, keys[0]) == before[keys[0]]:
                    assert time.monotonic() < deadline, "no check admitted under the load"
                    await asyncio.sleep(0.05)  # polling for the load's first admission
                await asyncio.sleep(1.0)  # the load runs through the namespaced endpoint
                _ip("link", "set", HOST_END, "down")
                cut = time.monotonic()
                try:

                    async def routed_around() -> bool:
                        endpoints = await _endpoints(http, router)
                        return bool(endpoints[local.node_url(0)]["active"])

                    await eventually(routed_around, within=10)
                    moved_after = time.monotonic() - cut
                    await asyncio.sleep(2.0)  # the partition lasts while the load goes on
                finally:
                    _ip("link", "set", HOST_END, "up")

                async def rejoined() -> bool:
                    return bool((await _endpoints(http, router))[away_url]["state"] == "up")

                await eventually(rejoined, within=20)
                report = await checks_report(load)
                assert report["errors"] == []
                answers = report["answers"]
                after = [a for a in answers if a[0] >= cut]
                last_degraded = max((a[0] for a in after if a[4]), default=cut) - cut
                print(
                    f"routed around {moved_after:.2f} s after the cut; {len(after)} checks "
                    f"after it, the last degraded one sent {last_degraded:.2f} s after it"
                )
                assert last_degraded <= 3.0
                assert any(not a[4] for a in after if a[0] - cut > last_degraded)
                held = await admitted(http, router, "api", answers)
                for key in keys:
                    assert await _used(http, router, key) == before[key] + held[key], key
        finally:
            away.stop()


async def _used_or_degraded(http: aiohttp.ClientSession, router: str, key: str) -> None:
    """One check of `key` (admitted, or answered degraded while the first endpoint stops)."""
    async with http.post(router + "/v1/check", json={"key": key, "rule": "api"}) as resp:
        await resp.read()
