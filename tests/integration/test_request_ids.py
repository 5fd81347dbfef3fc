"""A request_id replays only the request it was first used for (like Stripe's
idempotency keys): the same key, rule or inline limits, cost and amount replay the first
decision; anything else answers 409 `request-id-reused` and consumes nothing. On
/v1/check, in batches (that item only), on spread keys and in the SDK."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cluster.local.redis_proc import RedisProcess
from cluster.sdk import AsyncClient, CheckSpec, Client, RequestIdReused
from tests.conftest import RULES, Cluster, start_cluster, stop_cluster

REUSED = "https://shardlimit.dev/problems/request-id-reused"
DAY = {"algorithm": "calendar", "period": "day", "timezone": "UTC", "max_amount": "100.00"}
SPREAD_RULES = (
    RULES
    + """
  sale:
    spread: 4
    limits:
      - {algorithm: quota, limit: 40, max_amount: "400.00"}
"""
)


@pytest.fixture
async def cluster(redis_servers: list[RedisProcess], tmp_path: Path) -> AsyncIterator[Cluster]:
    started = await start_cluster(redis_servers, tmp_path, rules_yaml=SPREAD_RULES)
    try:
        yield started
    finally:
        await stop_cluster(started)


async def _amount_left(cluster: Cluster, key: str, rule: str) -> list[str]:
    return [limit["amount_remaining"] for limit in (await cluster.usage(key, rule))["limits"]]


def _assert_reused(status: int, body: dict[str, Any], key: str, request_id: str) -> None:
    assert status == 409, body
    assert body["type"] == REUSED and body["status"] == 409
    assert f"request_id {request_id!r} was first used for key {key!r}" in body["detail"]
    assert "allowed" not in body and "limits" not in body


def _assert_item_reused(item: dict[str, Any], key: str, request_id: str) -> None:
    """A batch item refused on its own: not admitted, nothing counted, its problem."""
    assert (item["allowed"], item["key"], item["limits"], item["replayed"]) == (
        False,
        key,
        [],
        False,
    )
    _assert_reused(item["problem"]["status"], item["problem"], key, request_id)


async def test_same_id_with_another_amount_or_cost_is_refused_and_consumes_nothing(
    cluster: Cluster,
) -> None:
    first = {"key": "m:1", "rule": "payments", "amount": "90.00", "request_id": "r-1"}
    status, body = await cluster.check(first)
    assert status == 200 and body["replayed"] is False
    assert await _amount_left(cluster, "m:1", "payments") == ["10.00", "910.00"]

    for other in ({"amount": "5.00"}, {"cost": 3}, {"amount": "90.01"}):
        status, body = await cluster.check({**first, **other})
        _assert_reused(status, body, "m:1", "r-1")
    assert await _amount_left(cluster, "m:1", "payments") == ["10.00", "910.00"]

    # The same request, however its amount is written, replays the first decision.
    for same in ({}, {"amount": "90"}, {"amount": 90.0}, {"cost": 1}):
        status, body = await cluster.check({**first, **same})
        assert (status, body["allowed"], body["replayed"]) == (200, True, True), body
    # A dry run of the same request answers the recorded decision too; of another, 409.
    status, body = await cluster.check({**first, "dry_run": True})
    assert (status, body["replayed"]) == (200, True)
    status, body = await cluster.check({**first, "amount": "1.00", "dry_run": True})
    _assert_reused(status, body, "m:1", "r-1")
    assert await _amount_left(cluster, "m:1", "payments") == ["10.00", "910.00"]


async def test_a_denied_request_id_is_not_a_free_pass_for_another_request(
    cluster: Cluster,
) -> None:
    status, _ = await cluster.check({"key": "b:1", "rule": "basic", "cost": 9, "request_id": "x"})
    assert status == 429
    status, body = await cluster.check(
        {"key": "b:1", "rule": "basic", "cost": 1, "request_id": "x"}
    )
    _assert_reused(status, body, "b:1", "x")
    assert (await cluster.usage("b:1", "basic"))["limits"][0]["remaining"] == 5


async def test_inline_limits_are_part_of_the_request(cluster: Cluster) -> None:
    first = {"key": "i:1", "limits": [DAY], "amount": "60.00", "request_id": "inl"}
    assert (await cluster.check(first))[0] == 200
    # The same limits written differently are the same request.
    same = {**first, "limits": [{**DAY, "max_amount": 100}]}
    status, body = await cluster.check(same)
    assert (status, body["replayed"]) == (200, True)
    other = {**first, "limits": [{**DAY, "max_amount": "1000.00"}]}
    status, body = await cluster.check(other)
    _assert_reused(status, body, "i:1", "inl")
    # Another rule (another scope) or another key is another request: not a reuse.
    status, body = await cluster.check(
        {"key": "i:1", "rule": "payments", "amount": "1.00", "request_id": "inl"}
    )
    assert (status, body["replayed"]) == (200, False)


async def test_refund_by_request_id_still_gives_back_the_first_decision(
    cluster: Cluster,
) -> None:
    first = {"key": "rf:1", "rule": "payments", "amount": "70.00", "request_id": "p-1"}
    assert (await cluster.check(first))[0] == 200
    _assert_reused(*(await cluster.check({**first, "amount": "1.00"})), "rf:1", "p-1")
    status, body = await cluster.post(
        "/v1/refund", {"key": "rf:1", "rule": "payments", "request_id": "p-1"}
    )
    assert status == 200, body
    assert [g["amount"] for g in body["given_back"]] == ["70.00", "70.00"]
    assert await _amount_left(cluster, "rf:1", "payments") == ["100.00", "1000.00"]


async def test_a_refund_naming_none_of_the_decisions_counters_gives_nothing_and_keeps_it(
    cluster: Cluster,
) -> None:
    hour = [{"algorithm": "fixed_window", "limit": 2, "window": "1h"}]
    other = [{"algorithm": "fixed_window", "limit": 5, "window": "2h"}]
    check = {"key": "rm:1", "limits": hour, "request_id": "rm"}
    status, body = await cluster.check(check)
    assert status == 200 and body["limits"][0]["remaining"] == 1
    refund = {"key": "rm:1", "request_id": "rm"}
    status, body = await cluster.post("/v1/refund", {**refund, "limits": other})
    assert status == 409 and body["type"].endswith("/refund-mismatch"), body
    for limits in (other, hour):  # the first consumed nothing, the second is untouched
        status, body = await cluster.check({"key": "rm:1", "limits": limits, "cost": 0})
        assert body["limits"][0]["remaining"] == (5 if limits is other else 1)
    status, body = await cluster.post("/v1/refund", {**refund, "limits": hour})
    assert status == 200 and body["given_back"] == [{"algorithm": "fixed_window", "count": 1}]
    status, body = await cluster.check({"key": "rm:1", "limits": hour, "cost": 0})
    assert body["limits"][0]["remaining"] == 2
    # Inline limits hold no leases: a refund naming one is refused as its check would be.
    leases = [{"algorithm": "concurrency", "limit": 2, "lease": "1m"}]
    status, body = await cluster.post("/v1/refund", {**refund, "limits": leases})
    assert status == 400 and body["errors"][0]["field"] == "limits", body


async def test_in_a_batch_only_the_reused_item_is_refused(cluster: Cluster) -> None:
    assert (await cluster.check({"key": "bt:1", "rule": "basic", "request_id": "q"}))[0] == 200
    checks = [
        {"key": "bt:2", "rule": "basic", "cost": 2},
        {"key": "bt:1", "rule": "basic", "cost": 4, "request_id": "q"},
        {"key": "bt:1", "rule": "basic", "request_id": "q"},
        {"key": "bt:3", "rule": "payments", "amount": "3.00", "request_id": "q"},
    ]
    status, body = await cluster.post("/v1/check/batch", {"checks": checks})
    assert status == 200
    results = body["results"]
    assert [r["allowed"] for r in results] == [True, False, True, True]
    _assert_item_reused(results[1], "bt:1", "q")
    assert results[2]["replayed"] is True
    assert (await cluster.usage("bt:1", "basic"))["limits"][0]["remaining"] == 4
    assert (await cluster.usage("bt:2", "basic"))["limits"][0]["remaining"] == 3

    # All or nothing: the reused item fails the batch, and the others are given back.
    status, body = await cluster.post(
        "/v1/check/batch", {"checks": checks[:2], "all_or_nothing": True}
    )
    assert status == 200 and body["allowed"] is False
    assert body["results"][0]["rolled_back"] is True
    _assert_item_reused(body["results"][1], "bt:1", "q")
    assert (await cluster.usage("bt:2", "basic"))["limits"][0]["remaining"] == 3
    assert (await cluster.usage("bt:1", "basic"))["limits"][0]["remaining"] == 4


async def test_spread_keys_refuse_a_reused_request_id(cluster: Cluster) -> None:
    first = {"key": "s:1", "rule": "sale", "cost": 3, "amount": "30.00", "request_id": "o-1"}
    status, body = await cluster.check(first)
    assert (status, body["limits"][0]["remaining"]) == (200, 37)
    for other in ({"cost": 1}, {"amount": "300.00"}):
        _assert_reused(*(await cluster.check({**first, **other})), "s:1", "o-1")
    status, body = await cluster.check(first)
    assert (status, body["replayed"]) == (200, True)
    usage = (await cluster.usage("s:1", "sale"))["limits"][0]
    assert (usage["remaining"], usage["amount_remaining"]) == (37, "370.00")


async def test_the_sdk_raises_request_id_reused(cluster: Cluster) -> None:
    async with AsyncClient(cluster.router_url, coalesce=False) as client:
        decision = await client.check("sdk:1", "payments", amount="40.00", request_id="k")
        assert decision.allowed and not decision.replayed
        with pytest.raises(RequestIdReused) as raised:
            await client.check("sdk:1", "payments", amount="41.00", request_id="k")
        assert raised.value.status == 409 and raised.value.index is None
        assert (await client.check("sdk:1", "payments", amount="40", request_id="k")).replayed

        with pytest.raises(RequestIdReused) as raised:
            await client.check_many(
                [
                    CheckSpec("sdk:2", "basic"),
                    CheckSpec("sdk:1", "payments", amount="1.00", request_id="k"),
                ]
            )
        assert raised.value.index == 1
        first, second = raised.value.results
        assert not isinstance(first, RequestIdReused) and first.allowed
        assert isinstance(second, RequestIdReused)

    # Coalesced checks: only the reused one raises, the others get their decisions.
    async with AsyncClient(cluster.router_url) as client:
        outcomes = await asyncio.gather(
            client.check("sdk:3", "basic"),
            client.check("sdk:1", "payments", amount="2.00", request_id="k"),
            return_exceptions=True,
        )
        assert not isinstance(outcomes[0], BaseException) and outcomes[0].allowed
        assert isinstance(outcomes[1], RequestIdReused)
    assert await _amount_left(cluster, "sdk:1", "payments") == ["60.00", "960.00"]


def _sync_session(url: str) -> None:
    with Client(url) as client:
        assert client.check("sync:1", "payments", amount="10.00", request_id="s").allowed
        with pytest.raises(RequestIdReused) as raised:
            client.check("sync:1", "payments", amount="11.00", request_id="s")
        assert raised.value.status == 409
        assert client.check("sync:1", "payments", amount="10", request_id="s").replayed
        with pytest.raises(RequestIdReused) as raised:
            client.check_many(
                [
                    CheckSpec("sync:1", "payments", cost=2, amount="10", request_id="s"),
                    CheckSpec("sync:2", "basic"),
                ]
            )
        assert raised.value.index == 0
        reused, second = raised.value.results
        assert isinstance(reused, RequestIdReused)
        assert not isinstance(second, RequestIdReused) and second.allowed


async def test_the_blocking_sdk_raises_request_id_reused(cluster: Cluster) -> None:
    await asyncio.to_thread(_sync_session, cluster.router_url)
    assert await _amount_left(cluster, "sync:1", "payments") == ["90.00", "990.00"]
