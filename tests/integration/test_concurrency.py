"""Many concurrent checks on one key: the limit holds exactly."""

from __future__ import annotations

import asyncio

from tests.conftest import Cluster


async def test_300_concurrent_checks_admit_exactly_50(cluster: Cluster) -> None:
    payload = {
        "key": "hot:1",
        "limits": [{"algorithm": "fixed_window", "limit": 50, "window": "1h"}],
    }
    results = await asyncio.gather(*(cluster.check(payload) for _ in range(300)))
    statuses = [status for status, _ in results]
    assert statuses.count(200) == 50
    assert statuses.count(429) == 250
    assert not any(body["degraded"] for _, body in results)
    remaining = sorted(body["limits"][0]["remaining"] for _, body in results if body["allowed"])
    assert remaining == list(range(50))  # every admitted check saw a distinct count


async def test_concurrent_amounts_in_tenths_admit_exactly_1000(cluster: Cluster) -> None:
    limit = {
        "algorithm": "calendar",
        "period": "day",
        "timezone": "America/Sao_Paulo",
        "max_amount": "100.00",
    }
    payload = {"key": "merchant:9", "limits": [limit], "amount": 0.1}
    results = await asyncio.gather(*(cluster.check(payload) for _ in range(1100)))
    admitted = [body for status, body in results if status == 200]
    degraded = [body.get("degraded_reason") for _, body in results if body["degraded"]]
    assert degraded == []
    assert len(admitted) == 1000
    assert sum(1 for status, _ in results if status == 429) == 100
    usage_payload = {**payload, "amount": 0, "cost": 0}
    status, body = await cluster.check(usage_payload)
    assert status == 200 and body["limits"][0]["amount_remaining"] == "0.00"


async def test_concurrent_checks_across_many_keys_and_nodes(slots_cluster: Cluster) -> None:
    limit = {"algorithm": "token_bucket", "rate": 1, "period": "1h", "burst": 7}
    keys = [f"user:{i}" for i in range(40)]
    payloads = [{"key": k, "limits": [limit]} for k in keys for _ in range(10)]
    results = await asyncio.gather(*(slots_cluster.check(p) for p in payloads))
    per_key: dict[str, int] = {}
    for status, body in results:
        if status == 200:
            per_key[body["key"]] = per_key.get(body["key"], 0) + 1
    assert per_key == dict.fromkeys(keys, 7)
    assert len({body["node"] for _, body in results}) == 3
