"""Leases on a cluster of real processes (a router, three nodes, three Redis with AOF,
cluster.local), with the acquirers in yet another process: never more than the limit
held at once on the node's clock, every freed slot taken again, and a lock (`limit: 1`)
held by exactly one at a time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bench.chaos_scenarios import ADMIN_TOKEN, ChaosCluster
from cluster.local.procs import until
from tests.support.lease_load import most_held_at_once, report_of, start_load

RULES = {
    "exports": {"limits": [{"algorithm": "concurrency", "limit": 5, "lease": "1m"}]},
    "settle": {"limits": [{"algorithm": "concurrency", "limit": 1, "lease": "1m"}]},
}


@pytest.fixture
async def processes(tmp_path: Path) -> AsyncIterator[ChaosCluster]:
    cluster = await ChaosCluster.start(tmp_path / "leases", appendfsync="everysec")
    try:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        for name, rule in RULES.items():
            url = f"{cluster.router_url}/v1/rules/{name}"
            async with cluster.http.put(url, json=rule, headers=headers) as resp:
                assert resp.status in (200, 201), await resp.text()
        yield cluster
    finally:
        await cluster.close()


async def usage(cluster: ChaosCluster, key: str, rule: str) -> tuple[int, int]:
    url = f"{cluster.router_url}/v1/usage?key={key}&rule={rule}"
    async with cluster.http.get(url) as resp:
        assert resp.status == 200, await resp.text()
        view = (await resp.json())["limits"][0]
    return view["held"], view["remaining"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("rule", "limit", "rounds"), [("exports", 5, 2), ("settle", 1, 1)])
async def test_acquirers_in_another_process_never_overlap_past_the_limit(
    processes: ChaosCluster, rule: str, limit: int, rounds: int
) -> None:
    async def served() -> bool:
        async with processes.http.get(f"{processes.router_url}/v1/rules/{rule}") as resp:
            return resp.status == 200

    await until(served, 10, f"rule {rule} served")
    workers = 300
    load = await start_load(processes.router_url, rule, "order:1", workers, rounds)
    report = await report_of(load)
    assert report["errors"] == []
    leases = report["leases"]
    assert len(leases) == workers * rounds
    assert most_held_at_once(leases) == limit
    fencing = sorted(lease["fencing"] for lease in leases)
    assert fencing == list(range(1, workers * rounds + 1))  # every grant, every slot reused
    assert await usage(processes, "order:1", rule) == (0, limit)
    print(f"{rule}: {len(leases)} leases in {report['seconds']} s, {report['denials']} denials")
