"""All-or-nothing holds: a batch whose router dies before committing is given back."""

from __future__ import annotations

import time
from typing import Any

import redis

from cluster import wire
from node.store import HOLDS_KEY
from tests.conftest import CLUSTER, Cluster, eventually

FW = {"algorithm": "fixed_window", "limit": 10, "window": "1h"}
MONEY = {"algorithm": "calendar", "period": "day", "timezone": "UTC", "max_amount": "100.00"}


async def node_batch(cluster: Cluster, node: str, ops: list[wire.Op]) -> list[wire.Result]:
    """Speak the node protocol the way a router does."""
    batch = wire.Batch(int(time.time() * 1000) + 5000, ops)
    async with cluster.http.post(
        cluster.node_urls[node] + wire.BATCH_PATH,
        data=wire.encode(batch),
        headers={"Authorization": f"Bearer {CLUSTER}", "Content-Type": wire.CONTENT_TYPE},
    ) as resp:
        assert resp.status == 200, await resp.text()
        return wire.decode_reply(await resp.read()).results


LIMITS: list[list[Any]] = [
    ["fixed_window", 10, 3_600_000, 0, "", "", None, 2],
    ["calendar", None, 0, 0, "day", "UTC", 10_000, 2],
]


def held_check(key: str, request_id: str, hold_ms: int, **extra: Any) -> wire.Op:
    return wire.Op("check", key, "~inline", LIMITS, [0, 2500], cost=3, request_id=request_id,
                   record_ttl_ms=60_000, hold_ms=hold_ms, **extra)  # fmt: skip


async def test_uncommitted_hold_is_given_back_by_the_node(cluster: Cluster) -> None:
    key = "hold:1"
    node = cluster.router.view.owner(key)
    # Phase one of an all-or-nothing batch, then the router "dies": no commit.
    [result] = await node_batch(cluster, node, [held_check(key, "aon-1", hold_ms=2000)])
    assert isinstance(result, wire.Checked) and result.allowed is True
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
    assert isinstance(replay, wire.Checked)
    assert replay.allowed is False and replay.replayed is True


async def test_committed_hold_stays(cluster: Cluster) -> None:
    key = "hold:2"
    node = cluster.router.view.owner(key)
    await node_batch(cluster, node, [held_check(key, "aon-2", hold_ms=5000)])
    commit = wire.Op("commit", key, "~inline", LIMITS, [0, 0], request_id="aon-2")
    [done] = await node_batch(cluster, node, [commit])
    assert done == wire.Committed(True)
    [again] = await node_batch(cluster, node, [commit])
    assert again == wire.Committed(False)  # committing twice is not a second commit
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


async def decide(cluster: Cluster, node: str, batch: str, wanted: str) -> str:
    async with cluster.http.post(
        cluster.node_urls[node] + "/node/v1/decision",
        json={"batch": batch, "decision": wanted},
        headers={"Authorization": f"Bearer {CLUSTER}"},
    ) as resp:
        assert resp.status == 200, await resp.text()
        decision: str = (await resp.json())["decision"]
        return decision


def keys_on_distinct_nodes(cluster: Cluster, prefix: str) -> tuple[str, str]:
    first = f"{prefix}:0"
    for i in range(1, 200):
        other = f"{prefix}:{i}"
        if cluster.router.view.owner(other) != cluster.router.view.owner(first):
            return first, other
    raise AssertionError("no two keys on distinct nodes")


async def test_the_first_decision_stands(cluster: Cluster) -> None:
    assert await decide(cluster, "n1", "b-first", "abort") == "abort"
    assert await decide(cluster, "n1", "b-first", "commit") == "abort"
    assert await decide(cluster, "n2", "b-second", "commit") == "commit"
    assert await decide(cluster, "n2", "b-second", "abort") == "commit"


async def test_holds_of_a_committed_batch_are_committed_by_the_sweepers(cluster: Cluster) -> None:
    """The router recorded "commit" on the coordinator, then died before committing."""
    key_a, key_b = keys_on_distinct_nodes(cluster, "dec-c")
    node_a, node_b = (cluster.router.view.owner(k) for k in (key_a, key_b))
    for key, node, rid in ((key_a, node_a, "c-a"), (key_b, node_b, "c-b")):
        op = held_check(key, rid, hold_ms=300, batch="b-commit", coordinator=node_a)
        [held] = await node_batch(cluster, node, [op])
        assert isinstance(held, wire.Checked) and held.allowed is True
    assert await decide(cluster, node_a, "b-commit", "commit") == "commit"

    async def settled() -> bool:
        total = 0
        for server in cluster.redis:
            direct = redis.Redis(port=server.port)
            total += direct.zcard(HOLDS_KEY)
            direct.close()
        return total == 0

    await eventually(settled, within=10)
    for key in (key_a, key_b):  # both stay consumed: cost 3 of 10, 25.00 of 100.00
        _, body = await cluster.check({"key": key, "limits": [FW, MONEY], "cost": 0})
        assert body["limits"][0]["remaining"] == 7, key
        assert body["limits"][1]["amount_remaining"] == "75.00", key


async def test_holds_of_an_undecided_batch_are_all_given_back(cluster: Cluster) -> None:
    """The router died before deciding: the first sweeper records "abort" for all."""
    key_a, key_b = keys_on_distinct_nodes(cluster, "dec-a")
    node_a, node_b = (cluster.router.view.owner(k) for k in (key_a, key_b))
    for key, node, rid in ((key_a, node_a, "a-a"), (key_b, node_b, "a-b")):
        op = held_check(key, rid, hold_ms=300, batch="b-undecided", coordinator=node_b)
        await node_batch(cluster, node, [op])

    async def given_back() -> bool:
        for key in (key_a, key_b):
            _, body = await cluster.check({"key": key, "limits": [FW, MONEY], "cost": 0})
            if body["limits"][0]["remaining"] != 10:
                return False
        return True

    await eventually(given_back, within=10)
    # A router coming back late cannot commit any more.
    assert await decide(cluster, node_b, "b-undecided", "commit") == "abort"


async def test_bad_decisions_are_refused(cluster: Cluster) -> None:
    bad: list[Any] = [{"batch": "b", "decision": "maybe"}, {"batch": "a|b", "decision": "x"}, []]
    for body in bad:
        async with cluster.http.post(
            cluster.node_urls["n1"] + "/node/v1/decision",
            json=body,
            headers={"Authorization": f"Bearer {CLUSTER}"},
        ) as resp:
            assert resp.status == 400, body
    op = held_check("k", "r", hold_ms=300, batch="b")  # no coordinator
    [result] = await node_batch(cluster, "n1", [op])
    assert isinstance(result, wire.Failed) and "coordinator" in result.detail
