"""A primary stopped (SIGSTOP) for longer than Sentinel's down-after is failed over
while checks flow from another process; once continued (SIGCONT) it is a demoted
process, and it never serves a decision: a decision it served would be lost when
Sentinel turns it into a replica, so every admission the clients saw, also of a
`durability: primary` rule, is in the counter at the end."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp
import pytest

from cluster.local.cluster import scratch_cluster
from cluster.local.loadgen import start_loadgen
from cluster.local.redis_proc import RedisProcess
from cluster.local.sentinel_proc import ask, sentinel_master, wait_for
from tests.conftest import eventually

pytestmark = [pytest.mark.system, pytest.mark.timeout(150)]
ADMIN = "stopped-primary-admin-token"
LIMIT = 1_000_000
RATE = [{"algorithm": "fixed_window", "limit": LIMIT, "window": "1d"}]  # durability primary


def _replication(process: RedisProcess) -> dict[str, Any]:
    """INFO replication, parsed by redis-py ({} when the process does not answer)."""
    info = ask(process.host, process.port, "INFO", "replication")
    return info if isinstance(info, dict) else {}


def _is_linked_replica(process: RedisProcess) -> bool:
    info = _replication(process)
    return info.get("role") == "slave" and info.get("master_link_status") == "up"


def _acked(info: dict[str, Any]) -> list[int]:
    """The replication offset each replica acknowledged, from the primary's INFO."""
    return [
        int(value["offset"])
        for name, value in info.items()
        if name.startswith("slave") and isinstance(value, dict) and "offset" in value
    ]


def _caught_up(primary: RedisProcess, offset: int, replicas: int) -> bool:
    """Every replica acknowledged the primary's stream up to `offset`."""
    acked = _acked(_replication(primary))
    return len(acked) == replicas and min(acked) >= offset


async def _check(http: aiohttp.ClientSession, router: str, key: str) -> dict[str, Any]:
    async with http.post(router + "/v1/check", json={"key": key, "limits": RATE}) as resp:
        answer: dict[str, Any] = await resp.json()
        return answer


async def _key_on(http: aiohttp.ClientSession, router: str, node: str) -> str:
    for i in range(1000):
        async with http.get(f"{router}/v1/locate?key=api:{i}") as resp:
            if (await resp.json())["node"] == node:
                return f"api:{i}"
    raise AssertionError(f"no key of 1,000 on {node}")


async def test_a_stopped_primary_never_serves_once_it_is_continued(tmp_path: Any) -> None:
    with scratch_cluster(2, admin_token=ADMIN, data_dir=tmp_path / "c", replicas=2) as local:
        assert local.replication is not None
        sentinels = local.replication.sentinels
        primary = local.redis[0]
        async with aiohttp.ClientSession() as http:
            key = await _key_on(http, local.router_url, "n1")
            for _ in range(10):
                answer = await _check(http, local.router_url, key)
                assert answer["allowed"] is True and not answer.get("degraded"), answer
            written = int(_replication(primary)["master_repl_offset"])
            wait_for(lambda: _caught_up(primary, written, 2), 10, "both replicas caught up")

            served = Served(http, local.router_url, key)
            body = json.dumps({"key": key, "limits": RATE})
            load = await start_loadgen(
                local.router_url + "/v1/check", connections=8, body=body, per_key=True
            )
            try:
                await eventually(served, within=20)
                primary.pause()
                stopped = time.monotonic()
                try:
                    wait_for(
                        lambda: sentinel_master(sentinels, "n1") != (primary.host, primary.port),
                        30,
                        "a replica promoted",
                    )
                    await eventually(served, within=30)
                    print(f"served again {time.monotonic() - stopped:.2f} s after SIGSTOP")
                finally:
                    primary.resume()
                # The window that matters: the old primary answers again and still
                # believes it is the primary, until Sentinel demotes it.
                wait_for(lambda: _is_linked_replica(primary), 30, "the old primary a replica")
                await eventually(served, within=20)
            finally:
                tally = await load.stop()
            admitted_by_load = tally["allowed_by_key"].get(key, 0)
            assert admitted_by_load > 0, tally
            final = await _check(http, local.router_url, key)
            assert final["allowed"] is True and not final.get("degraded"), final
            held = LIMIT - final["limits"][0]["remaining"]
            admitted = 10 + admitted_by_load + served.count + 1
            assert held == admitted, (held, admitted, tally)


class Served:
    """This test's own checks of the key, counted when answered normally."""

    def __init__(self, http: aiohttp.ClientSession, router: str, key: str) -> None:
        self.http, self.router, self.key = http, router, key
        self.count = 0

    async def __call__(self) -> bool:
        answer = await _check(self.http, self.router, self.key)
        if answer.get("degraded"):
            return False
        assert answer["allowed"] is True, answer
        self.count += 1
        return True
