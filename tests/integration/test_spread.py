"""Hot keys spread over sub-counters (`spread: N`): exact totals under concurrent load
from another process, fallback before denial, refunds to the admitting sub-counter,
usage sums, and live resharding in the middle of a sale."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest
import redis as sync_redis

from cluster.local.loadgen import run_loadgen, start_loadgen
from cluster.local.redis_proc import RedisProcess
from cluster.model.algorithms import DEFAULT_QUOTA_TTL_MS
from cluster.model.keys import counter_key, record_key, sub_key
from router.decide.spread import first_index
from router.rules.spread_split import share
from tests.conftest import (
    ADMIN,
    Cluster,
    add_spare_node,
    cluster_with_rules,
    eventually,
    start_cluster,
    stop_cluster,
)

RULES = """
rules:
  sale:
    spread: 4
    limits:
      - {algorithm: quota, limit: 1000}
  money:
    spread: 4
    limits:
      - {algorithm: quota, max_amount: "1000.00"}
  small:
    spread: 4
    limits:
      - {algorithm: quota, limit: 8}
  odd:
    spread: 3
    limits:
      - {algorithm: fixed_window, limit: 10, window: 1h}
      - {algorithm: calendar, period: day, max_count: 7, max_amount: "0.05"}
  daily:
    spread: 3
    limits:
      - {algorithm: fixed_window, limit: 500, window: 1h}
      - {algorithm: calendar, period: day, max_count: 400, max_amount: "150.00"}
"""
SHAPES = {"sale": "q", "money": "q", "small": "q"}


cluster = cluster_with_rules(RULES)


def sub_counters(cluster: Cluster, rule: str, key: str, n: int) -> list[tuple[int, int]]:
    """Each sub-counter's (used count, used amount) read straight from its node's Redis."""
    out = []
    for index in range(n):
        sub = sub_key(key, index)
        node = cluster.router.view.owner(sub)
        client = sync_redis.Redis(port=cluster.redis[int(node[1:]) - 1].port)
        raw = client.get(counter_key(rule, SHAPES[rule], sub))
        client.close()
        assert raw is None or isinstance(raw, bytes)
        count, amount = raw.decode().split(":") if raw else ("0", "0")
        out.append((int(count), int(amount)))
    return out


def admitted_by(cluster: Cluster, rule: str, key: str, request_id: str, n: int) -> list[int]:
    """The sub-counters whose idempotency record of `request_id` says admitted."""
    found = []
    for index in range(n):
        sub = sub_key(key, index)
        node = cluster.router.view.owner(sub)
        client = sync_redis.Redis(port=cluster.redis[int(node[1:]) - 1].port)
        stored = client.get(record_key(rule, request_id, sub))
        client.close()
        assert stored is None or isinstance(stored, bytes)
        if stored is not None and msgspec.msgpack.decode(stored)["result"][0] == 1:
            found.append(index)
    return found


def body(key: str, rule: str, **extra: Any) -> str:
    return orjson.dumps({"key": key, "rule": rule, **extra}).decode()


def assert_clean(report: dict[str, Any]) -> None:
    assert report["errors"] == 0, report["error_samples"]
    assert report["degraded"] == 0, report["degraded_reasons"]
    assert report["answered"] == report["requests"]


def test_the_split_adds_up_exactly() -> None:
    for total in (1, 7, 8, 1000, 1001, 100_003):
        for n in range(1, 65):
            shares = [share(total, n, i) for i in range(n)]
            assert sum(shares) == total and max(shares) - min(shares) <= 1
            assert [share(-total, n, i) for i in range(n)] == [-s for s in shares]


@pytest.mark.timeout(120)
async def test_a_stock_of_1000_spread_over_4_sells_exactly_1000(cluster: Cluster) -> None:
    url = cluster.router_url + "/v1/check"
    report = await run_loadgen(url, connections=128, body=body("drop", "sale"), requests=1600)
    assert_clean(report)
    assert report["allowed"] == 1000 and report["denied"] == 600
    assert sub_counters(cluster, "sale", "drop", 4) == [(250, 0)] * 4  # every one at 0 left
    usage = await cluster.usage("drop", "sale")
    assert usage["limits"][0]["limit"] == 1000 and usage["limits"][0]["remaining"] == 0
    status, denied = await cluster.check({"key": "drop", "rule": "sale"})
    assert status == 429 and denied["limits"][0]["remaining"] == 0


@pytest.mark.timeout(120)
async def test_a_money_stock_spread_over_4_sells_exactly_its_amount(cluster: Cluster) -> None:
    url = cluster.router_url + "/v1/check"
    sale = body("purse", "money", amount="2.50")
    report = await run_loadgen(url, connections=128, body=sale, requests=600)
    assert_clean(report)
    assert report["allowed"] == 400 and report["denied"] == 200  # 1000.00 / 2.50
    assert sub_counters(cluster, "money", "purse", 4) == [(100, 25_000)] * 4
    usage = await cluster.usage("purse", "money")
    assert usage["limits"][0]["max_amount"] == "1000.00"
    assert usage["limits"][0]["amount_remaining"] == "0.00"


@pytest.mark.timeout(120)
async def test_spread_windows_and_calendar_counts_and_amounts_stay_exact(
    cluster: Cluster,
) -> None:
    url = cluster.router_url + "/v1/check"
    # The day's amount binds first: 150.00 / 0.50 = 300, split 50.00 per sub-counter.
    report = await run_loadgen(
        url, connections=128, body=body("shop", "daily", amount="0.50"), requests=700
    )
    assert_clean(report)
    assert report["allowed"] == 300 and report["denied"] == 400
    usage = await cluster.usage("shop", "daily")
    assert [(v["limit"], v["remaining"]) for v in usage["limits"]] == [(500, 200), (400, 100)]
    assert usage["limits"][1]["amount_remaining"] == "0.00"
    # With no amount, the day's count binds: 400 split 134, 133, 133.
    report = await run_loadgen(url, connections=128, body=body("cart", "daily"), requests=700)
    assert_clean(report)
    assert report["allowed"] == 400 and report["denied"] == 300
    usage = await cluster.usage("cart", "daily")
    assert [(v["limit"], v["remaining"]) for v in usage["limits"]] == [(500, 100), (400, 0)]


async def test_a_check_falls_back_to_another_sub_counter(cluster: Cluster) -> None:
    # Request ids that all start at sub-counter 0: its share (2) goes first, then
    # the next checks are admitted by the others, until all 8 are sold.
    ids = [f"o{i}" for i in range(10_000) if first_index(f"o{i}", 4) == 0][:9]
    answers = [await cluster.check({"key": "k1", "rule": "small", "request_id": i}) for i in ids]
    assert [status for status, _ in answers] == [200] * 8 + [429]
    assert [sum(c for c, _ in sub_counters(cluster, "small", "k1", 4))] == [8]
    assert [admitted_by(cluster, "small", "k1", i, 4) for i in ids[:3]] == [[0], [0], [1]]
    assert answers[2][1]["limits"][0]["limit"] == 8
    assert answers[2][1]["limits"][0]["remaining"] == 5  # the whole key's stock
    assert answers[8][1]["retry_after_ms"] is None
    # A retry of an admitted check replays it, wherever it was admitted.
    again = await cluster.check({"key": "k1", "rule": "small", "request_id": ids[2]})
    assert again[0] == 200 and again[1]["replayed"] is True
    assert sum(c for c, _ in sub_counters(cluster, "small", "k1", 4)) == 8


async def test_a_refund_goes_back_to_the_sub_counter_that_admitted(cluster: Cluster) -> None:
    ids = [f"order-{i}" for i in range(8)]
    for request_id in ids:
        status, _ = await cluster.check({"key": "k2", "rule": "small", "request_id": request_id})
        assert status == 200
    assert sub_counters(cluster, "small", "k2", 4) == [(2, 0)] * 4
    [where] = admitted_by(cluster, "small", "k2", "order-5", 4)
    refund = {"key": "k2", "rule": "small", "request_id": "order-5"}
    status, answer = await cluster.post("/v1/refund", refund)
    assert status == 200 and answer["given_back"] == [{"algorithm": "quota", "count": 1}]
    expected = [(1, 0) if i == where else (2, 0) for i in range(4)]
    assert sub_counters(cluster, "small", "k2", 4) == expected  # that one: 0 -> 1 left
    status, _ = await cluster.post("/v1/refund", refund)
    assert status == 409
    assert sub_counters(cluster, "small", "k2", 4) == expected
    assert (await cluster.usage("k2", "small"))["limits"][0]["remaining"] == 1
    status, _ = await cluster.post("/v1/refund", {**refund, "request_id": "never"})
    assert status == 404


async def test_usage_and_cost_zero_read_the_sum(cluster: Cluster) -> None:
    for _ in range(4):
        assert (await cluster.check({"key": "k3", "rule": "odd", "amount": "0.01"}))[0] == 200
    usage = await cluster.usage("k3", "odd")
    assert [(v["limit"], v["remaining"]) for v in usage["limits"]] == [(10, 6), (7, 3)]
    assert usage["limits"][1]["amount_remaining"] == "0.01"
    status, read = await cluster.check({"key": "k3", "rule": "odd", "cost": 0})
    assert status == 200
    assert [(v["limit"], v["remaining"]) for v in read["limits"]] == [(10, 6), (7, 3)]
    # 0.05 split over 3 sub-counters is 0.02, 0.02, 0.01; 0.04 is spent: one cent is left.
    status, denied = await cluster.check({"key": "k3", "rule": "odd", "amount": "0.02"})
    assert status == 429 and denied["denied_by"] == [1]
    assert (await cluster.check({"key": "k3", "rule": "odd", "amount": "0.01"}))[0] == 200
    usage = await cluster.usage("k3", "odd")
    assert usage["limits"][1]["amount_remaining"] == "0.00"


async def test_dry_runs_in_a_row_each_answer_what_is_left(cluster: Cluster) -> None:
    """A dry run's rows are what a real check would leave: the router does not take them
    for the sub-counter's state, so dry runs one after another all answer 7 of 8, and the
    real check after them too."""
    for _ in range(6):
        status, dry = await cluster.check({"key": "dry", "rule": "small", "dry_run": True})
        assert status == 200 and dry["limits"][0]["remaining"] == 7, dry
    status, real = await cluster.check({"key": "dry", "rule": "small"})
    assert status == 200 and real["limits"][0]["remaining"] == 7, real
    assert (await cluster.usage("dry", "small"))["limits"][0]["remaining"] == 7


async def test_adjust_restocks_every_sub_counter_by_its_share(cluster: Cluster) -> None:
    for _ in range(8):
        assert (await cluster.check({"key": "k4", "rule": "small"}))[0] == 200
    restock = {"key": "k4", "rule": "small", "delta": 6, "request_id": "re-1"}
    status, answer = await cluster.post("/v1/quota/adjust", restock, ADMIN)
    assert status == 200 and answer["remaining"] == 6 and answer["limit"] == 8
    assert sub_counters(cluster, "small", "k4", 4) == [(0, 0), (0, 0), (1, 0), (1, 0)]
    status, answer = await cluster.post("/v1/quota/adjust", restock, ADMIN)
    assert status == 200 and answer["replayed"] is True and answer["remaining"] == 6
    assert [(await cluster.check({"key": "k4", "rule": "small"}))[0] for _ in range(7)] == [
        200
    ] * 6 + [429]


async def test_spread_is_validated(cluster: Cluster) -> None:
    cases = [
        ({"spread": 9, "limits": [{"algorithm": "quota", "limit": 8}]}, "body.spread"),
        ({"spread": 65, "limits": [{"algorithm": "quota", "limit": 800}]}, "body.spread"),
        ({"spread": True, "limits": [{"algorithm": "quota", "limit": 8}]}, "body.spread"),
        ({"spread": 2, "limits": [{"algorithm": "quota", "max_amount": "0.01"}]}, "body.spread"),
    ]
    for rule, field in cases:
        async with cluster.http.put(
            cluster.router_url + "/v1/rules/bad",
            json=rule,
            headers={"Authorization": f"Bearer {ADMIN}"},
        ) as resp:
            problem = await resp.json(content_type=None)
            assert resp.status == 400, rule
        assert [e["field"] for e in problem["errors"]] == [field], problem
    batch = {"checks": [{"key": "a", "rule": "small"}], "all_or_nothing": True}
    status, problem = await cluster.post("/v1/check/batch", batch)
    assert status == 400 and problem["errors"][0]["field"] == "checks[0].rule"
    status, answer = await cluster.post("/v1/check/batch", {**batch, "all_or_nothing": False})
    assert status == 200 and answer["results"][0]["allowed"] is True


@pytest.fixture
async def four_nodes(
    redis_servers: list[RedisProcess], fourth_redis: RedisProcess, tmp_path: Path
) -> AsyncIterator[tuple[Cluster, str]]:
    cluster = await start_cluster(redis_servers, tmp_path, rules_yaml=RULES)
    n4_url = await add_spare_node(cluster, fourth_redis)
    try:
        yield cluster, n4_url
    finally:
        await stop_cluster(cluster)


async def migrated(cluster: Cluster) -> None:
    async def done() -> bool:
        _, info = await cluster.get("/v1/cluster")
        migration = info["migration"]
        if migration and migration.get("last_error"):
            raise AssertionError(migration["last_error"])
        return bool(migration and migration.get("phase") == "done" and not migration["running"])

    await eventually(done, within=90)


@pytest.mark.timeout(180)
async def test_a_spread_sale_stays_exact_while_nodes_come_and_go(
    four_nodes: tuple[Cluster, str], tmp_path: Path
) -> None:
    cluster, n4_url = four_nodes
    # The sale's checks are one in ten of the load, so it lasts through both moves.
    lines = [body("launch", "sale")]
    lines += [body(f"bg:{i}", "small") for i in range(9)]
    bodies = tmp_path / "bodies.jsonl"
    bodies.write_text("\n".join(lines) + "\n")
    load = await start_loadgen(
        cluster.router_url + "/v1/check",
        connections=64,
        body="",
        bodies_file=str(bodies),
        per_key=True,
    )

    async def left() -> int:
        return int((await cluster.usage("launch", "sale"))["limits"][0]["remaining"])

    async def selling() -> bool:
        return await left() < 1000

    try:
        await eventually(selling)
        status, answer = await cluster.post("/v1/cluster/nodes", {"url": n4_url, "id": "n4"}, ADMIN)
        assert status == 202, answer
        await migrated(cluster)
        async with cluster.http.delete(
            cluster.router_url + "/v1/cluster/nodes/n2",
            headers={"Authorization": f"Bearer {ADMIN}"},
        ) as resp:
            assert resp.status == 202, await resp.text()
        await migrated(cluster)
        left_during = await left()

        async def sold_out() -> bool:
            return await left() == 0

        await eventually(sold_out, within=60)
    finally:
        report = await load.stop()
    print(f"stock left when both moves had ended: {left_during}")
    assert report["errors"] == 0, report["error_samples"]
    assert report["degraded"] == 0, report["degraded_reasons"]
    assert report["allowed_by_key"]["launch"] == 1000
    assert sub_counters(cluster, "sale", "launch", 4) == [(250, 0)] * 4
    placed = {cluster.router.view.owner(sub_key("launch", i)) for i in range(4)}
    assert "n2" not in placed
    for index in range(4):  # moved or not, each sub-counter kept its lifetime
        sub = sub_key("launch", index)
        node = cluster.router.view.owner(sub)
        client = sync_redis.Redis(port=cluster.redis[int(node[1:]) - 1].port)
        ttl = client.pttl(counter_key("sale", "q", sub))
        client.close()
        assert DEFAULT_QUOTA_TTL_MS - 600_000 < ttl <= DEFAULT_QUOTA_TTL_MS
    print(json.dumps({"sub_counter_nodes": sorted(placed)}))
