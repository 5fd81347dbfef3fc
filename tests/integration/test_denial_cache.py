"""`cache_denials: true`: a used-up key is answered by the router until its quota returns,
without a node call; the first check after that reaches the node again."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import ADMIN, Cluster, cluster_with_rules, eventually

pytestmark = pytest.mark.timeout(60)

WINDOW_MS = 2000
RULES = f"""
rules:
  burst:
    cache_denials: true
    limits:
      - {{algorithm: fixed_window, limit: 3, window: {WINDOW_MS}ms}}
  uncached:
    limits:
      - {{algorithm: fixed_window, limit: 3, window: 1h}}
  tickets:
    cache_denials: true
    limits:
      - {{algorithm: quota, limit: 2}}
  wallet:
    cache_denials: true
    limits:
      - {{algorithm: quota, limit: 100, max_amount: "5.00"}}
"""


cluster = cluster_with_rules(RULES)


def node_calls(cluster: Cluster) -> int:
    """Batch requests this router has sent to its nodes."""
    return int(cluster.router.metrics.count("shardlimit_node_round_trip_seconds_count"))


def cache_hits(cluster: Cluster, rule: str) -> int:
    return int(cluster.router.metrics.count("shardlimit_denial_cache_hits_total", rule=rule))


async def check(cluster: Cluster, rule: str, key: str, **extra: Any) -> dict[str, Any]:
    status, body = await cluster.check({"key": key, "rule": rule, **extra})
    assert status in (200, 429), body
    assert (status == 200) == body["allowed"]
    return body


async def test_a_used_up_key_is_answered_locally_until_its_window_resets(
    cluster: Cluster,
) -> None:
    # Start at the beginning of a window, so that the whole sequence below fits in it.
    now = await cluster.redis_now_ms()
    await cluster.set_time(now - now % WINDOW_MS + WINDOW_MS)
    for _ in range(3):
        assert (await check(cluster, "burst", "k"))["allowed"]
    first_denial = await check(cluster, "burst", "k")
    assert not first_denial["allowed"]
    assert "cached" not in first_denial  # decided by the node
    calls = node_calls(cluster)
    for _ in range(5):
        body = await check(cluster, "burst", "k")
        assert body["allowed"] is False and body["cached"] is True
        assert body["denied_by"] == [0]
        assert body["limits"][0]["remaining"] == 0
        assert 0 < body["retry_after_ms"] <= first_denial["retry_after_ms"]
    assert node_calls(cluster) == calls  # no node call while cached
    assert cache_hits(cluster, "burst") == 5
    decisions = cluster.router.metrics.count(
        "shardlimit_decisions_total", rule="burst", outcome="denied"
    )
    assert decisions == 6

    # Another key of the same rule is not affected.
    assert (await check(cluster, "burst", "other"))["allowed"]

    # After the reset the first check reaches the node, and is admitted.
    answers: list[dict[str, Any]] = []

    async def admitted() -> bool:
        answers.append(await check(cluster, "burst", "k"))
        return bool(answers[-1]["allowed"])

    calls = node_calls(cluster)
    await eventually(admitted, within=WINDOW_MS / 1000 + 5)
    assert all(body.get("cached") for body in answers[:-1])
    assert "cached" not in answers[-1]
    assert node_calls(cluster) == calls + 1
    assert cache_hits(cluster, "burst") == 5 + len(answers) - 1


async def test_a_rule_without_cache_denials_always_asks_its_node(cluster: Cluster) -> None:
    for _ in range(3):
        assert (await check(cluster, "uncached", "k"))["allowed"]
    calls = node_calls(cluster)
    for _ in range(4):
        body = await check(cluster, "uncached", "k")
        assert not body["allowed"] and "cached" not in body
    assert node_calls(cluster) == calls + 4
    assert cache_hits(cluster, "uncached") == 0


async def test_a_refund_through_this_router_is_seen_at_once(cluster: Cluster) -> None:
    assert (await check(cluster, "tickets", "u", request_id="r1"))["allowed"]
    assert (await check(cluster, "tickets", "u", request_id="r2"))["allowed"]
    assert not (await check(cluster, "tickets", "u"))["allowed"]
    assert (await check(cluster, "tickets", "u"))["cached"] is True
    status, refund = await cluster.post(
        "/v1/refund", {"key": "u", "rule": "tickets", "request_id": "r1"}
    )
    assert status == 200, refund
    body = await check(cluster, "tickets", "u")
    assert body["allowed"] and "cached" not in body
    assert body["limits"][0]["remaining"] == 0
    assert cache_hits(cluster, "tickets") == 1


async def test_a_restock_through_this_router_is_seen_at_once(cluster: Cluster) -> None:
    assert (await check(cluster, "tickets", "s"))["allowed"]
    assert (await check(cluster, "tickets", "s"))["allowed"]
    assert not (await check(cluster, "tickets", "s"))["allowed"]
    assert (await check(cluster, "tickets", "s"))["cached"] is True
    status, adjusted = await cluster.post(
        "/v1/quota/adjust",
        {"key": "s", "rule": "tickets", "delta": 1, "request_id": "restock-1"},
        token=ADMIN,
    )
    assert status == 200, adjusted
    body = await check(cluster, "tickets", "s")
    assert body["allowed"] and "cached" not in body


async def test_retries_and_reads_are_never_answered_from_the_cache(cluster: Cluster) -> None:
    first = await check(cluster, "tickets", "v", request_id="a")
    assert (await check(cluster, "tickets", "v"))["allowed"]
    assert not (await check(cluster, "tickets", "v"))["allowed"]
    calls = node_calls(cluster)
    # A retry must get its first decision back (allowed), not the cached denial.
    retry = await check(cluster, "tickets", "v", request_id="a")
    assert retry["allowed"] and retry["replayed"] is True
    assert retry["limits"] == first["limits"]
    # A read consumes nothing and reports the node's state.
    read = await check(cluster, "tickets", "v", cost=0)
    assert read["allowed"] and read["limits"][0]["remaining"] == 0 and "cached" not in read
    assert node_calls(cluster) == calls + 2
    assert cache_hits(cluster, "tickets") == 0


async def test_a_used_up_amount_blocks_only_checks_with_an_amount(cluster: Cluster) -> None:
    assert (await check(cluster, "wallet", "w", amount="5.00"))["allowed"]
    denied = await check(cluster, "wallet", "w", amount="0.01")
    assert not denied["allowed"] and "cached" not in denied
    cached = await check(cluster, "wallet", "w", amount="1.00")
    assert cached["cached"] is True and not cached["allowed"]
    # The count is not used up: a check with no amount still goes to the node.
    count_only = await check(cluster, "wallet", "w", amount=0)
    assert count_only["allowed"] and "cached" not in count_only
    assert count_only["limits"][0]["remaining"] == 98
    assert cache_hits(cluster, "wallet") == 1


async def test_a_denial_of_too_large_a_cost_is_not_cached(cluster: Cluster) -> None:
    assert (await check(cluster, "tickets", "big"))["allowed"]
    # One left: a cost of 2 is denied, but the key is not used up.
    assert not (await check(cluster, "tickets", "big", cost=2))["allowed"]
    body = await check(cluster, "tickets", "big")
    assert body["allowed"] and "cached" not in body
    assert cache_hits(cluster, "tickets") == 0


async def test_cache_denials_must_be_a_boolean(cluster: Cluster) -> None:
    async with cluster.http.put(
        cluster.router_url + "/v1/rules/x",
        json={"limits": [{"algorithm": "quota", "limit": 1}], "cache_denials": "yes"},
        headers={"Authorization": f"Bearer {ADMIN}"},
    ) as resp:
        problem = await resp.json(content_type=None)
        assert resp.status == 400, problem
    assert [e["field"] for e in problem["errors"]] == ["body.cache_denials"]
