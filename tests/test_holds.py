"""All-or-nothing holds: a batch whose router dies before committing is given back."""

from __future__ import annotations

from typing import Any

import redis

from node.store import HOLDS_KEY
from tests.conftest import CLUSTER, Cluster, eventually

FW = {"algorithm": "fixed_window", "limit": 10, "window": "1h"}
MONEY = {"algorithm": "calendar", "period": "day", "timezone": "UTC", "max_amount": "100.00"}


async def node_batch(cluster: Cluster, node: str, ops: list[dict[str, Any]]) -> list[Any]:
    """Speak the node protocol the way a router does."""
    async with cluster.http.post(
        cluster.node_urls[node] + "/node/v1/batch",
        json={"ops": ops},
        headers={"Authorization": f"Bearer {CLUSTER}"},
    ) as resp:
        assert resp.status == 200, await resp.text()
        results: list[Any] = (await resp.json())["results"]
        return results


def held_check(key: str, request_id: str, hold_ms: int) -> dict[str, Any]:
    limits = [[
        "fixed_window", 10, 3_600_000, 0, "", "", None, 2,
    ], ["calendar", None, 0, 0, "day", "UTC", 10_000, 2]]  # fmt: skip
    return {
        "op": "check", "key": key, "scope": "~inline", "limits": limits, "amounts": [0, 2500],
        "cost": 3, "request_id": request_id, "record_ttl_ms": 60_000, "hold_ms": hold_ms,
    }  # fmt: skip


async def test_uncommitted_hold_is_given_back_by_the_node(cluster: Cluster) -> None:
    key = "hold:1"
    node = cluster.router.view.owner(key)
    # Phase one of an all-or-nothing batch, then the router "dies": no commit.
    [result] = await node_batch(cluster, node, [held_check(key, "aon-1", hold_ms=2000)])
    assert result["allowed"] is True
    _, body = await cluster.check({"key": key, "limits": [FW, MONEY], "cost": 0})
    assert body["limits"][0]["remaining"] == 7 and body["limits"][1]["amount_remaining"] == "75.00"

    async def given_back() -> bool:
        _, body = await cluster.check({"key": key, "limits": [FW, MONEY], "cost": 0})
        return bool(body["limits"][0]["remaining"] == 10)

    await eventually(given_back, within=10)
    _, body = await cluster.check({"key": key, "limits": [FW, MONEY], "cost": 0})
    assert body["limits"][1]["amount_remaining"] == "100.00"
    index = int(node[1:]) - 1
    direct = redis.Redis(port=cluster.redis[index].port)
    assert direct.zcard(HOLDS_KEY) == 0
    direct.close()
    # A replay of the given-back request answers "denied" and consumes nothing.
    [replay] = await node_batch(cluster, node, [held_check(key, "aon-1", hold_ms=2000)])
    assert replay["allowed"] is False and replay["replayed"] is True


async def test_committed_hold_stays(cluster: Cluster) -> None:
    key = "hold:2"
    node = cluster.router.view.owner(key)
    await node_batch(cluster, node, [held_check(key, "aon-2", hold_ms=5000)])
    commit = {"op": "commit", "key": key, "scope": "~inline", "request_id": "aon-2",
              "limits": held_check(key, "x", 0)["limits"], "amounts": [0, 0]}  # fmt: skip
    [done] = await node_batch(cluster, node, [commit])
    assert done == {"s": "ok", "committed": True}
    [again] = await node_batch(cluster, node, [commit])
    assert again["committed"] is False  # committing twice is not a second commit
    index = int(node[1:]) - 1
    direct = redis.Redis(port=cluster.redis[index].port)

    assert direct.zcard(HOLDS_KEY) == 0  # the commit removed its sweeper entry
    direct.close()
    _, body = await cluster.check({"key": key, "limits": [FW, MONEY], "cost": 0})
    assert body["limits"][0]["remaining"] == 7 and body["limits"][1]["amount_remaining"] == "75.00"


async def test_router_batches_commit_their_holds(cluster: Cluster) -> None:
    batch = {"all_or_nothing": True, "checks": [
        {"key": f"hb:{i}", "limits": [FW], "cost": 2} for i in range(12)
    ]}  # fmt: skip
    status, body = await cluster.post("/v1/check/batch", batch)
    assert status == 200 and body["allowed"] is True
    for server in cluster.redis:
        direct = redis.Redis(port=server.port)
        assert direct.zcard(HOLDS_KEY) == 0  # every hold was committed
        direct.close()
    _, usage = await cluster.check({"key": "hb:3", "limits": [FW], "cost": 0})
    assert usage["limits"][0]["remaining"] == 8
