"""A check rolled back by its all-or-nothing batch reports the state after the rollback:
what it had consumed is back, in `remaining` and `amount_remaining`."""

from __future__ import annotations

from tests.conftest import Cluster


async def test_a_rolled_back_check_reports_what_is_left_after_the_rollback(
    cluster: Cluster,
) -> None:
    checks = [
        {"key": "aon:left", "rule": "basic", "cost": 3},
        {"key": "aon:pay", "rule": "payments", "amount": "10.50"},
        {"key": "aon:stock", "rule": "stock", "cost": 7, "amount": "2.25"},
        {"key": "aon:deny", "rule": "login", "cost": 4},  # 4 > 3: denied
    ]
    status, body = await cluster.post("/v1/check/batch", {"checks": checks, "all_or_nothing": True})
    assert status == 200, body
    left, pay, stock, denied = body["results"]
    assert body["allowed"] is False
    assert [r["rolled_back"] for r in (left, pay, stock)] == [True, True, True]
    assert "rolled_back" not in denied and denied["denied_by"] == [0]
    assert [v["remaining"] for v in left["limits"]] == [5]
    assert [v["amount_remaining"] for v in pay["limits"]] == ["100.00", "1000.00"]
    assert [(v["remaining"], v["amount_remaining"]) for v in stock["limits"]] == [
        (1_000_000, "1000000.00")
    ]
    # The same figures as the counters now hold.
    assert [v["remaining"] for v in (await cluster.usage("aon:left", "basic"))["limits"]] == [5]
    usage = await cluster.usage("aon:stock", "stock")
    assert [(v["remaining"], v["amount_remaining"]) for v in usage["limits"]] == [
        (1_000_000, "1000000.00")
    ]
