"""Decision semantics: all-or-nothing, idempotency, refunds, dry runs, co-location, rules."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from cluster.local.redis_proc import RedisProcess
from cluster.model.partition import routing_part
from tests.conftest import ADMIN, RULES, Cluster, eventually, start_cluster, stop_cluster


async def remaining(cluster: Cluster, key: str, rule: str) -> list[int | None]:
    usage = await cluster.usage(key, rule)
    return [limit["remaining"] for limit in usage["limits"]]


async def test_all_limits_of_a_rule_are_all_or_nothing(cluster: Cluster) -> None:
    # pair: 10 per hour and 3 per minute; the 4th check is denied by the minute
    # limit and must not consume from the hour limit either.
    results = [await cluster.check({"key": "aon:1", "rule": "pair"}) for _ in range(5)]
    assert [s for s, _ in results] == [200, 200, 200, 429, 429]
    assert results[3][1]["denied_by"] == [1]
    assert await remaining(cluster, "aon:1", "pair") == [7, 0]


async def test_request_id_makes_a_check_idempotent(cluster: Cluster) -> None:
    first = await cluster.check({"key": "idem:1", "rule": "basic", "request_id": "r-1", "cost": 2})
    again = await cluster.check({"key": "idem:1", "rule": "basic", "request_id": "r-1", "cost": 2})
    assert first[0] == again[0] == 200
    assert first[1]["replayed"] is False and again[1]["replayed"] is True
    assert again[1]["limits"] == first[1]["limits"]
    assert await remaining(cluster, "idem:1", "basic") == [3]
    # A denied first decision is replayed as denied, even once there is room.
    denied = await cluster.check({"key": "idem:1", "rule": "basic", "request_id": "r-2", "cost": 9})
    assert denied[0] == 429
    replay = await cluster.check({"key": "idem:1", "rule": "basic", "request_id": "r-2", "cost": 9})
    assert replay[0] == 429 and replay[1]["replayed"] is True


async def test_refund_gives_back_exactly_once(cluster: Cluster) -> None:
    check = {"key": "ref:1", "rule": "payments", "amount": "60.25", "request_id": "pay-1"}
    assert (await cluster.check(check))[0] == 200
    assert (await cluster.check({**check, "request_id": "pay-2", "amount": "30"}))[0] == 200
    usage = await cluster.usage("ref:1", "payments")
    assert [x["amount_remaining"] for x in usage["limits"]] == ["9.75", "909.75"]
    refund = {"key": "ref:1", "rule": "payments", "request_id": "pay-1"}
    status, body = await cluster.post("/v1/refund", refund)
    assert status == 200 and body["refunded"] is True
    assert [g["amount"] for g in body["given_back"]] == ["60.25", "60.25"]
    usage = await cluster.usage("ref:1", "payments")
    assert [x["amount_remaining"] for x in usage["limits"]] == ["70.00", "970.00"]
    status, body = await cluster.post("/v1/refund", refund)
    assert status == 409 and body["status"] == 409
    status, body = await cluster.post("/v1/refund", {**refund, "request_id": "never"})
    assert status == 404
    usage = await cluster.usage("ref:1", "payments")
    assert [x["amount_remaining"] for x in usage["limits"]] == ["70.00", "970.00"]
    # Replaying the refunded check still answers its first decision and consumes nothing.
    replay = await cluster.check(check)
    assert replay[0] == 200 and replay[1]["replayed"] is True
    usage = await cluster.usage("ref:1", "payments")
    assert [x["amount_remaining"] for x in usage["limits"]] == ["70.00", "970.00"]


@pytest.mark.parametrize(
    "limit",
    [
        {"algorithm": "token_bucket", "rate": 3, "period": "1h", "burst": 3},
        {"algorithm": "leaky_bucket", "rate": 3, "period": "1h", "capacity": 3},
    ],
)
async def test_a_bucket_refund_says_what_it_gave_back_as_remaining(
    cluster: Cluster, limit: dict[str, Any]
) -> None:
    """A bucket's level moves on between the check and its refund: `given_back.count` is
    the whole units of remaining the refund gave back, as the next read shows them."""
    key = f"bucket-refund:{limit['algorithm']}"
    check = {"key": key, "limits": [limit], "cost": 2, "request_id": f"{key}:1"}
    status, checked = await cluster.check(check)
    assert status == 200 and checked["limits"][0]["remaining"] == 1, checked
    status, refund = await cluster.post(
        "/v1/refund", {"key": key, "limits": [limit], "request_id": f"{key}:1"}
    )
    assert status == 200 and [g["count"] for g in refund["given_back"]] == [2], refund
    status, read = await cluster.check({"key": key, "limits": [limit], "cost": 0})
    assert read["limits"][0]["remaining"] == 3, read


async def test_refund_of_a_denied_decision_gives_nothing(cluster: Cluster) -> None:
    status, _ = await cluster.check({"key": "ref:2", "rule": "basic", "cost": 6, "request_id": "x"})
    assert status == 429
    status, body = await cluster.post(
        "/v1/refund", {"key": "ref:2", "rule": "basic", "request_id": "x"}
    )
    assert status == 200 and body["refunded"] is False
    assert await remaining(cluster, "ref:2", "basic") == [5]


async def test_sliding_log_refund_removes_its_entries(cluster: Cluster) -> None:
    for i in range(3):
        check = {"key": "ref:log", "rule": "login", "request_id": f"l{i}"}
        assert (await cluster.check(check))[0] == 200
    assert (await cluster.check({"key": "ref:log", "rule": "login"}))[0] == 429
    status, body = await cluster.post(
        "/v1/refund", {"key": "ref:log", "rule": "login", "request_id": "l1"}
    )
    assert status == 200 and body["given_back"][0]["count"] == 1
    assert (await cluster.check({"key": "ref:log", "rule": "login"}))[0] == 200
    assert (await cluster.check({"key": "ref:log", "rule": "login"}))[0] == 429


async def test_dry_run_and_cost_zero_consume_nothing(cluster: Cluster) -> None:
    status, body = await cluster.check(
        {"key": "dry:1", "rule": "basic", "cost": 5, "dry_run": True}
    )
    assert status == 200 and body["limits"][0]["remaining"] == 0 and body["dry_run"] is True
    status, body = await cluster.check(
        {"key": "dry:1", "rule": "basic", "cost": 6, "dry_run": True}
    )
    assert status == 429
    status, body = await cluster.check({"key": "dry:1", "rule": "basic", "cost": 0})
    assert status == 200 and body["limits"][0]["remaining"] == 5
    assert await remaining(cluster, "dry:1", "basic") == [5]
    await cluster.check({"key": "dry:1", "rule": "basic", "cost": 2})
    assert await remaining(cluster, "dry:1", "basic") == [3]


@pytest.mark.parametrize("partitioner", ["ring", "slots"])
async def test_hash_tags_colocate_keys(
    redis_servers: list[RedisProcess], tmp_path: Path, partitioner: str
) -> None:
    # One cluster at a time: a node keeps its cluster's topology in its Redis and
    # refuses another cluster's, so two clusters cannot share these Redis servers.
    target = await start_cluster(redis_servers, tmp_path, partitioner=partitioner, rules_yaml=RULES)
    try:
        nodes = set()
        for suffix in ("login", "pay", "search", "x:y"):
            _, body = await target.check({"key": f"{{user:7}}:{suffix}", "rule": "basic"})
            nodes.add(body["node"])
        assert len(nodes) == 1
        status, loc = await target.get("/v1/locate?key=%7Buser%3A7%7D%3Apay")
        assert status == 200 and loc["node"] in nodes
        assert ("slot" in loc) == (partitioner == "slots")
    finally:
        await stop_cluster(target)
    assert routing_part("{user:7}:login") == "user:7"


async def test_headers_follow_the_ratelimit_draft(cluster: Cluster) -> None:
    async with cluster.http.post(
        cluster.router_url + "/v1/check", json={"key": "hdr:1", "rule": "pair"}
    ) as resp:
        assert resp.status == 200
        assert resp.headers["RateLimit-Policy"] == '"pair.0";q=10;w=3600, "pair.1";q=3;w=60'
        assert re.fullmatch(r'"pair\.0";r=9;t=\d+, "pair\.1";r=2;t=\d+', resp.headers["RateLimit"])
        assert "Retry-After" not in resp.headers
    for _ in range(2):
        await cluster.check({"key": "hdr:1", "rule": "pair"})
    async with cluster.http.post(
        cluster.router_url + "/v1/check", json={"key": "hdr:1", "rule": "pair"}
    ) as resp:
        assert resp.status == 429
        assert 1 <= int(resp.headers["Retry-After"]) <= 60


async def test_t_is_the_time_until_more_quota(cluster: Cluster) -> None:
    """RateLimit's `t`: seconds until additional quota comes (the latest draft). A token
    bucket of 10 refilling 5 a minute, 3 tokens taken: full again in 36 s, but the next
    token comes within 12 s; a fixed window's `t` is its reset."""
    bucket = [{"algorithm": "token_bucket", "rate": 5, "period": "1m", "burst": 10}]
    for _ in range(2):
        await cluster.check({"key": "t:bucket", "limits": bucket})
    async with cluster.http.post(
        cluster.router_url + "/v1/check", json={"key": "t:bucket", "limits": bucket}
    ) as resp:
        body = await resp.json()
        assert body["limits"][0]["remaining"] == 7
        assert math.ceil(body["limits"][0]["reset_after_ms"] / 1000) == 36
        assert resp.headers["RateLimit"] == '"inline.0";r=7;t=12'
        assert resp.headers["RateLimit-Policy"] == '"inline.0";q=10;w=120'
    window = [{"algorithm": "fixed_window", "limit": 3, "window": "1h"}]
    async with cluster.http.post(
        cluster.router_url + "/v1/check", json={"key": "t:window", "limits": window}
    ) as resp:
        assert resp.headers["RateLimit"] == '"inline.0";r=2;t=3000'  # 10 past the hour


def keys_on_distinct_nodes(cluster: Cluster, count: int) -> list[str]:
    found: dict[str, str] = {}
    i = 0
    while len(found) < count:
        key = f"batch:{i}"
        found.setdefault(cluster.router.view.owner(key), key)
        i += 1
    return list(found.values())


async def test_batch_all_or_nothing_rolls_back_across_nodes(cluster: Cluster) -> None:
    a, b, c = keys_on_distinct_nodes(cluster, 3)
    # Exhaust c so the batch must fail on it.
    await cluster.check({"key": c, "rule": "basic", "cost": 5})
    batch: dict[str, Any] = {
        "all_or_nothing": True,
        "checks": [
            {"key": a, "rule": "basic", "cost": 2},
            {"key": b, "rule": "basic", "cost": 1, "request_id": "mine-1"},
            {"key": c, "rule": "basic", "cost": 1},
        ],
    }
    status, body = await cluster.post("/v1/check/batch", batch)
    assert status == 200 and body["allowed"] is False
    assert [r["allowed"] for r in body["results"]] == [False, False, False]
    assert [r.get("rolled_back", False) for r in body["results"]] == [True, True, False]
    assert len({r["node"] for r in body["results"]}) == 3
    assert await remaining(cluster, a, "basic") == [5]
    assert await remaining(cluster, b, "basic") == [5]
    # Retrying the rolled-back request id answers "denied" and consumes nothing.
    status, replay = await cluster.check({"key": b, "rule": "basic", "request_id": "mine-1"})
    assert status == 429 and replay["replayed"] is True
    assert await remaining(cluster, b, "basic") == [5]
    # Without all_or_nothing each check stands alone.
    batch["all_or_nothing"] = False
    batch["checks"][1]["request_id"] = "mine-2"
    status, body = await cluster.post("/v1/check/batch", batch)
    assert [r["allowed"] for r in body["results"]] == [True, True, False]
    assert await remaining(cluster, a, "basic") == [3]
    assert await remaining(cluster, b, "basic") == [4]
    # And an all_or_nothing batch that fits consumes everywhere.
    ok = {
        "all_or_nothing": True,
        "checks": [{"key": a, "rule": "basic"}, {"key": b, "rule": "basic"}],
    }
    status, body = await cluster.post("/v1/check/batch", ok)
    assert body["allowed"] is True
    assert await remaining(cluster, a, "basic") == [2]


async def test_rules_crud_needs_the_admin_token(cluster: Cluster) -> None:
    assert cluster.rules_file is not None
    file_before = cluster.rules_file.read_bytes()
    rule = {"limits": [{"algorithm": "fixed_window", "limit": 2, "window": "1h"}]}
    async with cluster.http.put(cluster.router_url + "/v1/rules/new", json=rule) as resp:
        assert resp.status == 401
        assert resp.content_type == "application/problem+json"
    wrong = {"Authorization": "Bearer nope"}
    async with cluster.http.put(
        cluster.router_url + "/v1/rules/new", json=rule, headers=wrong
    ) as resp:
        assert resp.status == 401
    admin = {"Authorization": f"Bearer {ADMIN}"}
    async with cluster.http.put(
        cluster.router_url + "/v1/rules/new", json=rule, headers=admin
    ) as resp:
        assert resp.status == 201
        created: dict[str, Any] = await resp.json()
        assert created["on_failure"] == "allow"
    assert [(await cluster.check({"key": "k", "rule": "new"}))[0] for _ in range(3)] == [
        200,
        200,
        429,
    ]
    # Raising the limit keeps the counter (same shape); changing the window resets it.
    rule["limits"][0]["limit"] = 3
    async with cluster.http.put(
        cluster.router_url + "/v1/rules/new", json=rule, headers=admin
    ) as resp:
        assert resp.status == 200
    assert [(await cluster.check({"key": "k", "rule": "new"}))[0] for _ in range(2)] == [200, 429]
    rule["limits"][0]["window"] = "2h"
    async with cluster.http.put(
        cluster.router_url + "/v1/rules/new", json=rule, headers=admin
    ) as resp:
        assert resp.status == 200
    assert (await cluster.check({"key": "k", "rule": "new"}))[1]["limits"][0]["remaining"] == 2
    status, listing = await cluster.get("/v1/rules")
    assert "new" in [r["name"] for r in listing["rules"]]
    # The cluster holds the rules; a router never rewrites its rules file.
    assert cluster.rules_file.read_bytes() == file_before
    async with cluster.http.delete(cluster.router_url + "/v1/rules/new") as resp:
        assert resp.status == 401
    async with cluster.http.delete(cluster.router_url + "/v1/rules/new", headers=admin) as resp:
        assert resp.status == 204
    status, body = await cluster.check({"key": "k", "rule": "new"})
    assert status == 400 and body["errors"][0]["field"] == "rule"
    status, _ = await cluster.get("/v1/rules/new")
    assert status == 404


async def test_rules_file_is_hot_reloaded(cluster: Cluster) -> None:
    assert cluster.rules_file is not None
    original = cluster.rules_file.read_text()
    cluster.rules_file.write_text(
        original + "  hot:\n    limits:\n      - {algorithm: fixed_window, limit: 1, window: 1h}\n"
    )

    async def visible() -> bool:
        return (await cluster.get("/v1/rules/hot"))[0] == 200

    await eventually(visible)
    assert [(await cluster.check({"key": "h", "rule": "hot"}))[0] for _ in range(2)] == [200, 429]
    # A broken file is refused and the previous rules stay in force.
    cluster.rules_file.write_text("rules: [this is not a mapping")
    reloads = cluster.router.rules.reload_errors

    async def rejected() -> bool:
        return cluster.router.rules.reload_errors > reloads

    await eventually(rejected)
    assert (await cluster.get("/v1/rules/hot"))[0] == 200
    assert cluster.router.rules.reload_errors == reloads + 1


async def test_a_request_id_reused_with_other_limits_is_refused(cluster: Cluster) -> None:
    """A replay answers with the first decision; a request_id reused with other limits
    (here one more) gets 409 instead of a decision it cannot describe, and consumes
    nothing."""
    one = [{"algorithm": "fixed_window", "limit": 5, "window": "1h"}]
    two = [*one, {"algorithm": "fixed_window", "limit": 9, "window": "1m"}]
    status, first = await cluster.check({"key": "rid", "limits": one, "request_id": "r-1"})
    assert status == 200 and first["replayed"] is False
    status, again = await cluster.check({"key": "rid", "limits": one, "request_id": "r-1"})
    assert status == 200 and again["replayed"] is True
    status, problem = await cluster.check({"key": "rid", "limits": two, "request_id": "r-1"})
    assert status == 409 and problem["type"].endswith("/request-id-reused"), problem
    status, body = await cluster.check({"key": "rid", "limits": one, "cost": 0})
    assert body["limits"][0]["remaining"] == 4


async def test_a_huge_amount_is_a_400_not_a_crash(cluster: Cluster) -> None:
    status, problem = await cluster.check({"key": "m", "rule": "payments", "amount": "1e999999999"})
    assert status == 400 and problem["errors"][0]["field"] == "amount", problem


async def test_an_amount_written_as_a_json_number_keeps_every_digit(cluster: Cluster) -> None:
    """A JSON number is read exactly, as a string is: extra decimals are refused, never
    rounded away by a float (99.999999999999999 would be charged as 100.00)."""
    money = '[{"algorithm":"calendar","period":"day","max_amount":"100.00"}]'

    async def send(path: str, text: str, token: str | None = None) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        async with cluster.http.request(
            "PUT" if path.startswith("/v1/rules/") else "POST",
            cluster.router_url + path,
            data=text.encode(),
            headers=headers,
        ) as resp:
            return resp.status, await resp.json(content_type=None)

    for number in ("99.999999999999999", "100.000000000000001", "0.0099999999999999999", "1e-400"):
        status, problem = await send(
            "/v1/check", f'{{"key":"exact","limits":{money},"amount":{number}}}'
        )
        assert status == 400, (number, problem)
        assert problem["errors"][0]["message"] == "has more than 2 decimal places", problem
    status, problem = await send("/v1/check", f'{{"key":"exact","limits":{money},"amount":1e999}}')
    assert status == 400 and problem["type"].endswith("/validation"), problem  # valid JSON
    status, batch = await send(
        "/v1/check/batch",
        f'{{"checks":[{{"key":"exact","limits":{money},"amount":0.1000000001}}]}}',
    )
    assert status == 400 and batch["errors"][0]["field"].endswith("amount"), batch
    status, problem = await send(
        "/v1/rules/exact-money",
        '{"limits":[{"algorithm":"calendar","period":"day","max_amount":100.000000000000001}]}',
        ADMIN,
    )
    assert status == 400 and problem["errors"][0]["field"].endswith("max_amount"), problem
    status, answer = await send("/v1/check", f'{{"key":"exact","limits":{money},"amount":99.99}}')
    assert status == 200 and answer["limits"][0]["amount_remaining"] == "0.01", answer


async def test_an_amount_no_limit_takes_may_be_any_decimal(cluster: Cluster) -> None:
    """A count limit ignores `amount`, but a request_id still binds it: amounts far past
    what a money limit could take, with and without request ids, singly and in a batch."""
    one = [{"algorithm": "fixed_window", "limit": 5, "window": "1h"}]
    huge, tiny = "7.43e19498076624", "1e-999999"
    for amount, request_id in ((huge, "big-1"), (tiny, "small-1"), (huge, None)):
        body: dict[str, Any] = {"key": "anyamount", "limits": one, "amount": amount}
        if request_id:
            body["request_id"] = request_id
        status, answer = await cluster.check(body)
        assert status == 200 and answer["replayed"] is False, answer
    status, again = await cluster.check(
        {"key": "anyamount", "limits": one, "amount": "743e19498076622", "request_id": "big-1"}
    )
    assert status == 200 and again["replayed"] is True, again
    status, problem = await cluster.check(
        {"key": "anyamount", "limits": one, "amount": "7.44e19498076624", "request_id": "big-1"}
    )
    assert status == 409 and problem["type"].endswith("/request-id-reused"), problem
    status, batch = await cluster.post(
        "/v1/check/batch",
        {"checks": [{"key": "anyamount", "limits": one, "amount": huge, "request_id": "big-2"}]},
    )
    first = batch["results"][0]
    assert status == 200 and first["allowed"] is True, batch
    assert first["limits"][0]["remaining"] == 1  # four checks counted: not the replay, not the 409
