"""The `quota` algorithm: a count and/or an exact amount with no window, refunds,
expiry, and restocks through POST /v1/quota/adjust (and `shardlimit quota adjust`)."""

from __future__ import annotations

import asyncio
import json
import sys
from decimal import Decimal
from typing import Any

import redis.asyncio as aioredis

from cluster.model.algorithms import DEFAULT_QUOTA_TTL_MS
from cluster.model.errors import Problems
from cluster.model.keys import counter_key
from cluster.model.limits import parse_timestamp
from cluster.sdk.client import AsyncClient
from tests.conftest import (
    ADMIN,
    PINNED_MS,
    Cluster,
    cluster_with_rules,
)

ENDS = "2027-06-01T00:00:00Z"  # after the tests' pinned clock (and after today)
RULES = f"""
rules:
  stock:
    limits:
      - {{algorithm: quota, limit: 5}}
  wallet:
    limits:
      - {{algorithm: quota, max_amount: "100.00"}}
  promo:
    limits:
      - {{algorithm: quota, limit: 3, max_amount: "50", expires_at: "{ENDS}"}}
  window:
    limits:
      - {{algorithm: fixed_window, limit: 5, window: 1h}}
"""


cluster = cluster_with_rules(RULES)


async def view(cluster: Cluster, key: str, rule: str) -> dict[str, Any]:
    usage = await cluster.usage(key, rule)
    limit: dict[str, Any] = usage["limits"][0]
    return limit


async def adjust(cluster: Cluster, body: dict[str, Any]) -> tuple[int, Any]:
    return await cluster.post("/v1/quota/adjust", body, token=ADMIN)


async def test_a_count_quota_admits_exactly_its_limit_and_never_resets(cluster: Cluster) -> None:
    answers = [await cluster.check({"key": "q:1", "rule": "stock", "cost": 2}) for _ in range(3)]
    assert [status for status, _ in answers] == [200, 200, 429]
    body = answers[1][1]
    assert body["limits"] == [
        {
            "algorithm": "quota",
            "limit": 5,
            "remaining": 1,
            "reset_after_ms": None,
            "max_amount": None,
            "amount_remaining": None,
        }
    ]
    assert answers[2][1]["retry_after_ms"] is None  # nothing comes back by itself
    assert (await cluster.check({"key": "q:1", "rule": "stock"}))[0] == 200
    assert (await cluster.check({"key": "q:1", "rule": "stock"}))[0] == 429
    await cluster.set_time(PINNED_MS + 300 * 86_400_000)  # no window: still spent
    assert (await view(cluster, "q:1", "stock"))["remaining"] == 0


async def test_the_counter_lives_quota_ttl_from_its_last_change(cluster: Cluster) -> None:
    assert (await cluster.check({"key": "q:ttl", "rule": "stock"}))[0] == 200
    client = aioredis.Redis(port=cluster.owner_redis("q:ttl").port)
    try:
        ttl = await client.pttl(counter_key("stock", "q", "q:ttl"))
    finally:
        await client.aclose()
    assert DEFAULT_QUOTA_TTL_MS - 60_000 < ttl <= DEFAULT_QUOTA_TTL_MS


async def test_a_money_quota_counts_exact_amounts_and_refunds_once(cluster: Cluster) -> None:
    first = {"key": "w:1", "rule": "wallet", "amount": "60.25", "request_id": "buy-1"}
    assert (await cluster.check(first))[0] == 200
    assert (await cluster.check({**first, "request_id": "buy-2", "amount": "39.76"}))[0] == 429
    assert (await cluster.check({**first, "request_id": "buy-3", "amount": "39.75"}))[0] == 200
    assert (await view(cluster, "w:1", "wallet"))["amount_remaining"] == "0.00"
    refund = {"key": "w:1", "rule": "wallet", "request_id": "buy-1"}
    status, body = await cluster.post("/v1/refund", refund)
    assert status == 200
    assert body["given_back"] == [{"algorithm": "quota", "count": 1, "amount": "60.25"}]
    assert (await view(cluster, "w:1", "wallet"))["amount_remaining"] == "60.25"
    status, body = await cluster.post("/v1/refund", refund)
    assert status == 409 and body["type"].endswith("already-refunded")
    assert (await view(cluster, "w:1", "wallet"))["amount_remaining"] == "60.25"
    # The refunded check's replay answers its first decision and consumes nothing.
    replay = await cluster.check(first)
    assert replay[0] == 200 and replay[1]["replayed"] is True
    assert (await view(cluster, "w:1", "wallet"))["amount_remaining"] == "60.25"


async def test_expires_at_ends_the_quota(cluster: Cluster) -> None:
    ends = parse_timestamp(ENDS, "", Problems())
    assert ends is not None
    status, body = await cluster.check({"key": "p:1", "rule": "promo", "amount": "20"})
    assert status == 200
    limit = body["limits"][0]
    assert limit["remaining"] == 2 and limit["amount_remaining"] == "30.00"
    # The pinned clock runs on from PINNED_MS while the test runs.
    assert ends - PINNED_MS - 60_000 < limit["reset_after_ms"] <= ends - PINNED_MS
    await cluster.set_time(ends)
    status, body = await cluster.check({"key": "p:1", "rule": "promo"})
    assert status == 429
    assert body["limits"][0]["remaining"] == 0
    assert body["limits"][0]["amount_remaining"] == "0.00"
    assert body["limits"][0]["reset_after_ms"] is None
    restock = {"key": "p:1", "rule": "promo", "delta": 5, "request_id": "late"}
    status, problem = await adjust(cluster, restock)
    assert status == 409 and problem["type"].endswith("quota-over")


async def test_expires_at_in_the_past_is_a_400(cluster: Cluster) -> None:
    past = {"algorithm": "quota", "limit": 3, "expires_at": "2020-01-01T00:00:00Z"}
    async with cluster.http.put(
        cluster.router_url + "/v1/rules/old",
        json={"limits": [past]},
        headers={"Authorization": f"Bearer {ADMIN}"},
    ) as resp:
        status, body = resp.status, await resp.json(content_type=None)
    assert status == 400
    assert [e["field"] for e in body["errors"]] == ["body.limits[0].expires_at"]
    status, body = await cluster.check({"key": "k", "limits": [past]})
    assert status == 400
    assert [e["field"] for e in body["errors"]] == ["limits[0].expires_at"]
    bad = {"algorithm": "quota", "limit": 3, "expires_at": "next tuesday"}
    status, body = await cluster.check({"key": "k", "limits": [bad]})
    assert status == 400 and body["errors"][0]["field"] == "limits[0].expires_at"
    status, body = await cluster.check({"key": "k", "limits": [{"algorithm": "quota"}]})
    assert status == 400 and body["errors"][0]["field"] == "limits[0]"


async def test_expires_at_message_and_boundary_agree(cluster: Cluster) -> None:
    """The first instant the message names is accepted as a time (and is in the past);
    the one before it is out of range, with the same message."""
    answers = {}
    for at in ("1970-01-01T00:00:00Z", "1969-12-31T23:59:59Z", "9999-12-31T23:59:59Z"):
        limit = {"algorithm": "quota", "limit": 3, "expires_at": at}
        status, body = await cluster.check({"key": "k", "limits": [limit]})
        answers[at] = (status, body["errors"][0]["message"] if status == 400 else None)
    assert answers == {
        "1970-01-01T00:00:00Z": (400, "must be in the future"),
        "1969-12-31T23:59:59Z": (400, "must be in the years 1970 to 9999"),
        "9999-12-31T23:59:59Z": (200, None),
    }


async def test_adjust_restocks_and_sets_once_per_request_id(cluster: Cluster) -> None:
    for _ in range(5):
        assert (await cluster.check({"key": "q:adj", "rule": "stock"}))[0] == 200
    restock = {"key": "q:adj", "rule": "stock", "delta": 3, "request_id": "restock-1"}
    status, body = await adjust(cluster, restock)
    assert status == 200
    assert body == {
        "key": "q:adj",
        "rule": "stock",
        "request_id": "restock-1",
        "replayed": False,
        "limit": 5,
        "remaining": 3,
        "max_amount": None,
        "amount_remaining": None,
        "reset_after_ms": None,
    }
    status, again = await adjust(cluster, restock)  # the same request: applied once
    assert status == 200 and again == {**body, "replayed": True}
    assert (await view(cluster, "q:adj", "stock"))["remaining"] == 3
    status, problem = await adjust(cluster, {**restock, "delta": 4})
    assert status == 409 and problem["type"].endswith("request-id-reused")
    assert (await view(cluster, "q:adj", "stock"))["remaining"] == 3
    del restock["delta"]
    status, body = await adjust(cluster, {**restock, "set": 7, "request_id": "set-1"})
    assert status == 200 and body["remaining"] == 7  # a stock may grow past its limit
    status, body = await adjust(cluster, {**restock, "delta": -9, "request_id": "cut-1"})
    assert status == 200 and body["remaining"] == 0  # never below zero
    assert (await cluster.check({"key": "q:adj", "rule": "stock"}))[0] == 429


async def test_adjust_a_money_quota(cluster: Cluster) -> None:
    assert (await cluster.check({"key": "w:adj", "rule": "wallet", "amount": "99.99"}))[0] == 200
    body = {"key": "w:adj", "rule": "wallet", "delta_amount": "10.5", "request_id": "top-up"}
    status, answer = await adjust(cluster, body)
    assert status == 200
    assert answer["max_amount"] == "100.00" and answer["amount_remaining"] == "10.51"
    status, answer = await adjust(
        cluster, {"key": "w:adj", "rule": "wallet", "set_amount": 25, "request_id": "reset"}
    )
    assert status == 200 and answer["amount_remaining"] == "25.00"
    assert (await view(cluster, "w:adj", "wallet"))["amount_remaining"] == "25.00"


async def test_adjust_refuses_what_it_cannot_do(cluster: Cluster) -> None:
    base: dict[str, Any] = {"key": "k", "rule": "stock", "request_id": "r"}
    ok = {**base, "delta": 1}
    status, _ = await cluster.post("/v1/quota/adjust", ok)
    assert status == 401
    cases: list[tuple[dict[str, Any], list[str]]] = [
        ({**ok, "rule": "window"}, ["rule"]),
        ({**ok, "rule": "nope"}, ["rule"]),
        ({**ok, "rule": "wallet"}, ["delta"]),
        ({**ok, "delta_amount": "1"}, ["delta_amount"]),
        ({**ok, "set": 2}, ["set"]),
        ({**ok, "delta": 1.5}, ["delta"]),
        ({**base, "set": -1}, ["set"]),
        ({"key": "k", "rule": "stock", "request_id": "r"}, ["body"]),
        ({**ok, "request_id": None}, ["request_id"]),
        ({**ok, "extra": 1}, ["extra"]),
        ({**base, "rule": "wallet", "delta_amount": "0.001"}, ["delta_amount"]),
        ({**base, "rule": "wallet", "set_amount": "-1"}, ["set_amount"]),
    ]
    for body, fields in cases:
        status, problem = await adjust(cluster, body)
        assert status == 400, body
        assert sorted(e["field"] for e in problem["errors"]) == sorted(fields), (body, problem)
    assert (await view(cluster, "k", "stock"))["remaining"] == 5


async def shardlimit(*argv: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "cluster.cli",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_cli_and_the_sdk_adjust_a_quota(cluster: Cluster) -> None:
    for _ in range(5):
        assert (await cluster.check({"key": "q:cli", "rule": "stock"}))[0] == 200
    common = ("--rule", "stock", "--router", cluster.router_url, "--token", ADMIN)
    argv = ("quota", "adjust", "q:cli", "--delta", "2", "--request-id", "cli-1", *common)
    code, out, err = await shardlimit(*argv, "--json")
    assert code == 0, err
    assert json.loads(out)["remaining"] == 2 and json.loads(out)["replayed"] is False
    code, out, _ = await shardlimit(*argv)
    assert code == 0
    assert (
        out
        == "q:cli (stock), remaining 2 of 5; request id cli-1 (already applied: nothing changed)\n"
    )
    code, _, err = await shardlimit(
        "quota", "adjust", "q:cli", "--set", "1", "--request-id", "cli-1", *common
    )
    assert code == 2 and "409" in err
    code, _, err = await shardlimit(
        "quota", "adjust", "q:cli", "--delta", "1", "--set", "1", *common
    )
    assert code == 2
    async with AsyncClient(cluster.router_url, admin_token=ADMIN) as client:
        answer = await client.quota_adjust("w:sdk", "wallet", request_id="sdk-1", set_amount="12.5")
        assert answer.amount_remaining == Decimal("12.50") and answer.replayed is False
    assert (await view(cluster, "q:cli", "stock"))["remaining"] == 2
    assert (await view(cluster, "w:sdk", "wallet"))["amount_remaining"] == "12.50"


async def test_an_amount_scale_names_its_own_counter(cluster: Cluster) -> None:
    """Minor units read at another scale would be misread (60.00 kept as 6000 is 0.6000 at
    scale 4): a limit of another scale counts on a counter of its own."""
    cents = [{"algorithm": "quota", "max_amount": "100.00"}]
    finer = [{"algorithm": "quota", "max_amount": "100.0000", "amount_scale": 4}]
    status, body = await cluster.check({"key": "s:1", "limits": cents, "amount": "60.00"})
    assert status == 200 and body["limits"][0]["amount_remaining"] == "40.00"
    status, body = await cluster.check({"key": "s:1", "limits": finer, "amount": "0.0001"})
    assert status == 200 and body["limits"][0]["amount_remaining"] == "99.9999"
    status, body = await cluster.check({"key": "s:1", "limits": cents, "amount": "40.01"})
    assert status == 429 and body["limits"][0]["amount_remaining"] == "40.00"
