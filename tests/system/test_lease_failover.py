"""Leases through a failover of their shard: a lock rule with `durability: replica`
whose key's primary Redis is killed while acquirers in another process take and release
it. Sentinel promotes a replica and the node follows; through it, never more than the
limit is held at once on the Redis clock, and `fencing` keeps growing from where it was:
no value is granted twice. Real processes: redis-servers, 3 Sentinels, nodes, a router."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from cluster.local.cluster import scratch_cluster
from tests.support.lease_load import most_held_at_once, report_of, start_load
from tests.system.replication import key_on

pytestmark = [pytest.mark.system, pytest.mark.timeout(180)]
ADMIN = "lease-failover-admin"
# Leases outlive the failover (about 3 s here), so a release whose answer the failover
# lost is told apart from an expiry by sending it again (tests/support/lease_load.py).
RULE = {
    "limits": [{"algorithm": "concurrency", "limit": 2, "lease": "10s"}],
    "durability": "replica",
}


async def _held(http: aiohttp.ClientSession, router: str, key: str) -> int:
    """Leases of `key` held now (0 while its node answers degraded)."""
    async with http.get(f"{router}/v1/usage?key={key}&rule=jobs") as resp:
        answer = await resp.json()
    return 0 if answer.get("degraded") else int(answer["limits"][0]["held"])


async def test_fencing_and_the_limit_hold_through_a_failover(tmp_path: Path) -> None:
    with scratch_cluster(2, admin_token=ADMIN, data_dir=tmp_path / "c", replicas=2) as local:
        router = local.router_url
        async with aiohttp.ClientSession() as http:
            headers = {"Authorization": f"Bearer {ADMIN}"}
            async with http.put(f"{router}/v1/rules/jobs", json=RULE, headers=headers) as resp:
                assert resp.status in (200, 201), await resp.text()
            key = await key_on(http, router, "n1", "job")
            load = await start_load(router, "jobs", key, 40, 12, through_outage=True)
            # Leases are being granted: then the shard's primary dies under them.
            deadline = time.monotonic() + 30
            while not await _held(http, router, key):
                assert time.monotonic() < deadline, "no lease held under the load"
                await asyncio.sleep(0.02)
            local.redis[0].kill()
            report = await report_of(load)
    assert report["errors"] == []
    leases = report["leases"]
    assert len(leases) == 40 * 12
    assert most_held_at_once(leases) <= 2
    by_time = sorted(leases, key=lambda lease: (lease["acquired_at_ms"], lease["fencing"]))
    fencing = [lease["fencing"] for lease in by_time]
    assert len(set(fencing)) == len(fencing)  # no fencing value granted twice
    assert fencing == sorted(fencing)  # and each later grant has a larger one
    assert report["denials"] > 0
    unreleased = sum(1 for lease in leases if not lease["released"])
    print(f"{len(leases)} leases, fencing up to {max(fencing)}, {unreleased} left to expire")
