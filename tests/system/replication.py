"""What the replication tests ask a Redis process directly (INFO replication, ROLE), and
the checks they send through the router."""

from __future__ import annotations

from typing import Any

import aiohttp

from cluster.local.redis_proc import RedisProcess
from cluster.local.sentinel_proc import ask

__all__ = ["Served", "caught_up", "check", "is_linked_replica", "key_on", "replication"]


def replication(process: RedisProcess) -> dict[str, Any]:
    """INFO replication, parsed by redis-py ({} when the process does not answer)."""
    info = ask(process.host, process.port, "INFO", "replication")
    return info if isinstance(info, dict) else {}


def is_linked_replica(process: RedisProcess) -> bool:
    info = replication(process)
    return info.get("role") == "slave" and info.get("master_link_status") == "up"


def caught_up(primary: RedisProcess, offset: int, replicas: int) -> bool:
    """`replicas` replicas acknowledged the primary's stream up to `offset`."""
    acked = [
        int(value["offset"])
        for name, value in replication(primary).items()
        if name.startswith("slave") and isinstance(value, dict) and "offset" in value
    ]
    return len(acked) == replicas and min(acked) >= offset


async def check(
    http: aiohttp.ClientSession, router: str, key: str, limits: list[Any]
) -> dict[str, Any]:
    async with http.post(router + "/v1/check", json={"key": key, "limits": limits}) as resp:
        answer: dict[str, Any] = await resp.json()
        return answer


async def key_on(http: aiohttp.ClientSession, router: str, node: str, prefix: str) -> str:
    for i in range(1000):
        async with http.get(f"{router}/v1/locate?key={prefix}:{i}") as resp:
            if (await resp.json())["node"] == node:
                return f"{prefix}:{i}"
    raise AssertionError(f"no key of 1,000 on {node}")


class Served:
    """A test's own checks of one key, counted when answered normally: a condition for
    `eventually` (False while answered degraded)."""

    def __init__(
        self, http: aiohttp.ClientSession, router: str, key: str, limits: list[Any]
    ) -> None:
        self.http, self.router, self.key, self.limits = http, router, key, limits
        self.count = 0

    async def __call__(self) -> bool:
        answer = await check(self.http, self.router, self.key, self.limits)
        if answer.get("degraded"):
            return False
        assert answer["allowed"] is True, answer
        self.count += 1
        return True
