"""The `concurrency` algorithm: leases acquired by checks, renewed and released by id
(POST /v1/lease/renew, /v1/lease/release), expiring on the node's Redis clock, with a
fencing value that grows strictly per rule and key. In-process cluster, real Redis."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from cluster.model.keys import counter_key
from tests.conftest import ADMIN, Cluster, cluster_with_rules
from tests.support.metrics_scrape import scrape, value

RULES = """
rules:
  exports:
    limits:
      - {algorithm: concurrency, limit: 2, lease: 30s}
  lock:
    limits:
      - {algorithm: concurrency, limit: 1, lease: 10s}
  daily:
    limits:
      - {algorithm: concurrency, limit: 5, lease: 30s}
      - {algorithm: fixed_window, limit: 2, window: 1h}
  basic:
    limits:
      - {algorithm: fixed_window, limit: 1, window: 1h}
  trial:
    shadow: true
    limits:
      - {algorithm: concurrency, limit: 1, lease: 30s}
"""

cluster = cluster_with_rules(RULES)


async def acquire(cluster: Cluster, key: str, rule: str = "exports", **extra: Any) -> Any:
    return await cluster.check({"key": key, "rule": rule, **extra})


async def renew(cluster: Cluster, key: str, lease_id: str, **extra: Any) -> tuple[int, Any]:
    body = {"key": key, "rule": extra.pop("rule", "exports"), "lease_id": lease_id, **extra}
    return await cluster.post("/v1/lease/renew", body)


async def release(cluster: Cluster, key: str, lease_id: str, rule: str = "exports") -> Any:
    return await cluster.post("/v1/lease/release", {"key": key, "rule": rule, "lease_id": lease_id})


async def held(cluster: Cluster, key: str, rule: str = "exports") -> tuple[int, int]:
    usage = await cluster.usage(key, rule)
    limit = usage["limits"][0]
    assert "lease" not in usage
    return limit["held"], limit["remaining"]


async def test_checks_acquire_leases_up_to_the_limit_then_wait_for_the_first_to_expire(
    cluster: Cluster,
) -> None:
    first = await acquire(cluster, "t:1")
    await cluster.set_time(first[1]["lease"]["acquired_at_ms"] + 10_000)
    second = await acquire(cluster, "t:1")
    assert [first[0], second[0]] == [200, 200]
    one, two = first[1]["lease"], second[1]["lease"]
    assert (one["fencing"], two["fencing"]) == (1, 2)
    assert one["ttl_ms"] == two["ttl_ms"] == 30_000
    assert one["id"] != two["id"] and one["id"].startswith("1.")
    assert second[1]["limits"] == [
        {"algorithm": "concurrency", "limit": 2, "remaining": 0, "reset_after_ms":
         one["acquired_at_ms"] + 30_000 - two["acquired_at_ms"], "held": 2}
    ]  # fmt: skip
    status, denied = await acquire(cluster, "t:1")
    assert status == 429 and "lease" not in denied and denied["denied_by"] == [0]
    # The earliest held lease frees the next slot: its expiry is the retry time.
    retry = denied["retry_after_ms"]
    assert retry == denied["limits"][0]["reset_after_ms"]
    assert 0 < retry <= one["acquired_at_ms"] + 30_000 - two["acquired_at_ms"]
    assert await held(cluster, "t:1") == (2, 0)
    # Once the first lease's time is up (node clock), its slot is taken again.
    await cluster.set_time(one["acquired_at_ms"] + 30_000)
    status, third = await acquire(cluster, "t:1")
    assert status == 200 and third["lease"]["fencing"] == 3
    assert (await renew(cluster, "t:1", one["id"]))[0] == 404
    assert await held(cluster, "t:1") == (2, 0)


async def test_renew_extends_a_held_lease_and_release_frees_its_slot(cluster: Cluster) -> None:
    _, body = await acquire(cluster, "lock:1", "lock")
    lease = body["lease"]
    status, renewed = await renew(cluster, "lock:1", lease["id"], rule="lock")
    assert status == 200
    assert renewed["lease"] == {"id": lease["id"], "fencing": 1, "ttl_ms": 10_000}
    assert renewed["renewed_at_ms"] >= lease["acquired_at_ms"]
    status, longer = await renew(cluster, "lock:1", lease["id"], rule="lock", ttl="1m")
    assert status == 200 and longer["lease"]["ttl_ms"] == 60_000
    # Renewed for a minute: still held after the lock's own 10 s.
    await cluster.set_time(longer["renewed_at_ms"] + 59_000)
    assert (await acquire(cluster, "lock:1", "lock"))[0] == 429
    status, released = await release(cluster, "lock:1", lease["id"], "lock")
    assert status == 200
    assert released["released"] is True and released["fencing"] == 1
    assert released["lease_id"] == lease["id"] and released["rule"] == "lock"
    assert await held(cluster, "lock:1", "lock") == (0, 1)
    status, again = await release(cluster, "lock:1", lease["id"], "lock")
    assert status == 404 and again["type"].endswith("/lease-not-found")
    assert (await renew(cluster, "lock:1", lease["id"], rule="lock"))[0] == 404
    status, next_holder = await acquire(cluster, "lock:1", "lock")
    assert status == 200 and next_holder["lease"]["fencing"] == 2


async def test_only_the_lease_id_releases_a_lease(cluster: Cluster) -> None:
    _, body = await acquire(cluster, "lock:2", "lock")
    lease_id = body["lease"]["id"]
    fencing, nonce = lease_id.split(".")
    guessed = f"{fencing}.{(int(nonce, 16) ^ 1):012x}"
    for key, rule, named in (
        ("lock:2", "lock", guessed),  # the right fencing value, another nonce
        ("lock:3", "lock", lease_id),  # another key
        ("lock:2", "exports", lease_id),  # another rule
    ):
        status, problem = await release(cluster, key, named, rule)
        assert status == 404 and problem["type"].endswith("/lease-not-found"), (key, rule)
    assert await held(cluster, "lock:2", "lock") == (1, 0)
    assert (await release(cluster, "lock:2", lease_id, "lock"))[0] == 200


async def test_an_unrenewed_lease_expires_on_the_node_clock(cluster: Cluster) -> None:
    _, body = await acquire(cluster, "lock:4", "lock")
    lease = body["lease"]
    await cluster.set_time(lease["acquired_at_ms"] + 9_000)
    assert await held(cluster, "lock:4", "lock") == (1, 0)
    await cluster.set_time(lease["acquired_at_ms"] + 10_000)
    assert await held(cluster, "lock:4", "lock") == (0, 1)
    status, problem = await renew(cluster, "lock:4", lease["id"], rule="lock")
    assert status == 404 and problem["type"].endswith("/lease-not-found")
    # The fencing counter outlives its leases: the next holder gets a higher value.
    _, next_holder = await acquire(cluster, "lock:4", "lock")
    assert next_holder["lease"]["fencing"] == 2
    # The node that pruned it counted one expiration.
    node_url = cluster.node_urls[body["node"]]
    families = await scrape(cluster.http, node_url)
    assert value(families, "shardlimit_node_lease_expirations_total", node=body["node"]) == 1


async def test_a_retried_check_gets_the_same_lease_back(cluster: Cluster) -> None:
    first = await acquire(cluster, "t:2", request_id="export-7")
    again = await acquire(cluster, "t:2", request_id="export-7")
    assert first[0] == again[0] == 200
    assert again[1]["lease"] == first[1]["lease"] and again[1]["replayed"] is True
    assert await held(cluster, "t:2") == (1, 1)
    # A refund of that decision gives its slot back (it releases the lease).
    status, refund = await cluster.post(
        "/v1/refund", {"key": "t:2", "rule": "exports", "request_id": "export-7"}
    )
    assert status == 200 and refund["given_back"] == [{"algorithm": "concurrency", "count": 1}]
    assert await held(cluster, "t:2") == (0, 2)
    assert (await renew(cluster, "t:2", first[1]["lease"]["id"]))[0] == 404


async def test_a_rate_limit_that_denies_takes_no_lease(cluster: Cluster) -> None:
    """Concurrency and a rate limit in one rule are decided together: all or nothing."""
    leases = []
    for _ in range(2):
        status, body = await acquire(cluster, "t:3", "daily")
        assert status == 200
        leases.append(body["lease"])
        assert (await release(cluster, "t:3", body["lease"]["id"], "daily"))[0] == 200
    status, denied = await acquire(cluster, "t:3", "daily")
    assert status == 429 and denied["denied_by"] == [1] and "lease" not in denied
    assert await held(cluster, "t:3", "daily") == (0, 5)
    assert [lease["fencing"] for lease in leases] == [1, 2]


async def test_dry_runs_and_cost_zero_acquire_nothing(cluster: Cluster) -> None:
    for extra in ({"dry_run": True}, {"cost": 0}):
        status, body = await acquire(cluster, "t:4", **extra)
        assert status == 200 and "lease" not in body, extra
    assert await held(cluster, "t:4") == (0, 2)
    _, body = await acquire(cluster, "t:4")
    assert body["lease"]["fencing"] == 1


async def test_leases_live_in_one_redis_key_of_the_limit_key(cluster: Cluster) -> None:
    """One ZSET named like every counter (so a migration moves it with the key), that
    outlives its leases by the quota TTL (so fencing never goes back)."""
    _, body = await acquire(cluster, "t:5")
    client = aioredis.Redis(port=cluster.owner_redis("t:5").port)
    try:
        name = counter_key("exports", "cc", "t:5")
        assert await client.type(name) == b"zset"
        fencing, nonce = body["lease"]["id"].split(".")
        members = await client.zrange(name, 0, -1, withscores=True)
        expiry = body["lease"]["acquired_at_ms"] + 30_000
        assert members == [(b"f", -1.0), (f"{fencing}:{int(nonce, 16)}".encode(), expiry)]
        assert await client.pttl(name) > 399 * 86_400_000
    finally:
        await client.aclose()


async def test_an_all_or_nothing_batch_that_is_rolled_back_releases_its_lease(
    cluster: Cluster,
) -> None:
    assert (await cluster.check({"key": "b:1", "rule": "basic"}))[0] == 200
    status, batch = await cluster.post(
        "/v1/check/batch",
        {
            "checks": [{"key": "t:6", "rule": "exports"}, {"key": "b:1", "rule": "basic"}],
            "all_or_nothing": True,
        },
    )
    assert status == 200 and batch["allowed"] is False
    first = batch["results"][0]
    assert first["rolled_back"] is True and "lease" not in first
    assert await held(cluster, "t:6") == (0, 2)
    status, batch = await cluster.post(
        "/v1/check/batch",
        {"checks": [{"key": "t:6", "rule": "exports"}], "all_or_nothing": True},
    )
    assert batch["allowed"] is True and batch["results"][0]["lease"]["fencing"] == 2
    assert await held(cluster, "t:6") == (1, 1)


async def test_metrics_count_lease_events(cluster: Cluster) -> None:
    metrics = cluster.router.metrics
    _, body = await acquire(cluster, "lock:9", "lock")
    await acquire(cluster, "lock:9", "lock")
    await renew(cluster, "lock:9", body["lease"]["id"], rule="lock")
    await release(cluster, "lock:9", body["lease"]["id"], "lock")
    await release(cluster, "lock:9", body["lease"]["id"], "lock")
    events = {
        event: metrics.count("shardlimit_lease_events_total", rule="lock", event=event)
        for event in ("acquired", "denied", "renewed", "released", "not_found")
    }
    assert events == {"acquired": 1, "denied": 1, "renewed": 1, "released": 1, "not_found": 1}


async def test_nodes_report_the_leases_held_per_rule(cluster: Cluster) -> None:
    """`shardlimit_node_leases_held{rule}` summed over the nodes: the unexpired leases
    of each rule with a concurrency limit, as a scrape's SCAN pass found them."""

    async def held_now() -> dict[str, float]:
        total: dict[str, float] = {}
        for node, url in cluster.node_urls.items():
            for family in await scrape(cluster.http, url):
                for sample in family.samples:
                    if sample.name == "shardlimit_node_leases_held":
                        assert sample.labels["node"] == node
                        rule = sample.labels["rule"]
                        total[rule] = total.get(rule, 0) + sample.value
        return total

    ids = []
    for key in ("census:1", "census:2", "census:3"):
        _, body = await acquire(cluster, key)
        ids.append((key, body["lease"]["id"]))
    await acquire(cluster, "census:4", "lock")
    assert await held_now() == {"exports": 3, "lock": 1, "daily": 0, "trial": 0}
    await release(cluster, *ids[0])
    assert await held_now() == {"exports": 2, "lock": 1, "daily": 0, "trial": 0}


async def test_bad_lease_input_is_a_clear_400(cluster: Cluster) -> None:
    _, body = await acquire(cluster, "t:7")
    lease_id = body["lease"]["id"]
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("/v1/lease/renew", {"key": "t:7", "rule": "basic", "lease_id": lease_id}, "rule"),
        ("/v1/lease/renew", {"key": "t:7", "rule": "exports", "lease_id": "7"}, "lease_id"),
        ("/v1/lease/renew", {"key": "t:7", "rule": "exports", "lease_id": lease_id, "ttl": "2d"},
         "ttl"),
        ("/v1/lease/release", {"key": "t:7", "rule": "exports", "lease_id": lease_id, "ttl": 1},
         "ttl"),
        ("/v1/lease/release", {"key": "t:7", "rule": "nope", "lease_id": lease_id}, "rule"),
        ("/v1/lease/release", {"rule": "exports", "lease_id": lease_id}, "key"),
        ("/v1/check", {"key": "t:7", "rule": "exports", "cost": 2}, "cost"),
        ("/v1/check", {"key": "t:7", "limits": [{"algorithm": "concurrency", "limit": 1,
                                                  "lease": "1s"}]}, "limits"),
    ]  # fmt: skip
    for path, request, field in cases:
        status, problem = await cluster.post(path, request)
        assert status == 400 and problem["type"].endswith("/validation"), (path, request)
        assert [error["field"] for error in problem["errors"]] == [field], problem
    status, problem = await cluster.get("/v1/authz?rule=exports&key=t:7")
    assert status == 400 and problem["errors"][0]["field"] == "rule"
    # A lease_id that is there but malformed is told apart from a missing one.
    for given, said in (
        ({"lease_id": "zzz"}, "is not a lease id"),
        ({"lease_id": " " + lease_id}, "is not a lease id"),
        ({}, "is required"),
    ):
        status, problem = await cluster.post(
            "/v1/lease/release", {"key": "t:7", "rule": "exports", **given}
        )
        assert status == 400 and problem["errors"][0]["message"].startswith(said), problem
    assert await held(cluster, "t:7") == (1, 1)


async def test_rules_refuse_what_a_concurrency_limit_cannot_do(cluster: Cluster) -> None:
    def concurrency(**fields: Any) -> dict[str, Any]:
        return {"algorithm": "concurrency", "limit": 3, "lease": "30s", **fields}

    cases: list[tuple[dict[str, Any], str]] = [
        ({"limits": [concurrency(lease="25h")]}, "body.limits[0].lease"),
        ({"limits": [concurrency(limit=0)]}, "body.limits[0].limit"),
        ({"limits": [concurrency(limit=100_001)]}, "body.limits[0].limit"),
        ({"limits": [concurrency(window="1s")]}, "body.limits[0].window"),
        ({"limits": [concurrency(), concurrency(limit=4)]}, "body.limits[1]"),
        ({"limits": [concurrency()], "spread": 2}, "body.spread"),
        ({"limits": [concurrency()], "cache_denials": True}, "body.cache_denials"),
    ]
    for rule, field in cases:
        async with cluster.http.put(
            cluster.router_url + "/v1/rules/r",
            json=rule,
            headers={"Authorization": f"Bearer {ADMIN}"},
        ) as resp:
            problem = await resp.json(content_type=None)
            assert resp.status == 400, (rule, problem)
            assert [e["field"] for e in problem["errors"]] == [field], (rule, problem)
    status, rules = await cluster.get("/v1/rules")
    assert status == 200 and [rule["name"] for rule in rules["rules"]] == [
        "basic",
        "daily",
        "exports",
        "lock",
        "trial",
    ]


async def test_a_shadow_rule_answers_a_denial_as_allowed_without_a_lease(cluster: Cluster) -> None:
    _, first = await acquire(cluster, "s:1", "trial")
    status, second = await acquire(cluster, "s:1", "trial")
    assert first["lease"]["fencing"] == 1
    assert status == 200 and second["shadow"] is True and "lease" not in second
    assert await held(cluster, "s:1", "trial") == (1, 0)


async def test_a_concurrency_rule_fails_closed_by_default(cluster: Cluster) -> None:
    """A degraded answer acquires nothing: "allowed" would hand out no lease."""
    for name, on_failure in (("lock", "deny"), ("daily", "deny"), ("basic", "allow")):
        status, rule = await cluster.get(f"/v1/rules/{name}")
        assert status == 200 and rule["on_failure"] == on_failure, name
