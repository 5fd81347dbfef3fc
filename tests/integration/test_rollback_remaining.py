"""A check rolled back by its all-or-nothing batch reports the state after the rollback:
what it had consumed is back, in `remaining` and `amount_remaining`."""

from __future__ import annotations

from typing import Any

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


async def test_a_replay_of_a_rolled_back_check_is_the_first_answer(cluster: Cluster) -> None:
    """The same batch again, or one of its checks alone, replays what was answered: rolled
    back, with what was left after the rollback; a refund of it finds nothing consumed."""
    checks: list[dict[str, Any]] = [
        {"key": "aon:r1", "rule": "basic", "cost": 3, "request_id": "aon-r1"},
        {"key": "aon:r2", "rule": "payments", "amount": "10.50", "request_id": "aon-r2"},
        {"key": "aon:r3", "rule": "login", "cost": 4, "request_id": "aon-r3"},  # denied
    ]
    batch = {"checks": checks, "all_or_nothing": True}
    status, first = await cluster.post("/v1/check/batch", batch)
    assert status == 200 and first["allowed"] is False, first
    status, again = await cluster.post("/v1/check/batch", batch)
    assert status == 200 and again["allowed"] is False, again
    for before, replay in zip(first["results"][:2], again["results"][:2], strict=True):
        assert replay["replayed"] is True and replay["allowed"] is False, replay
        assert replay.get("rolled_back") is True, replay
        assert replay["limits"] == before["limits"], (before, replay)
    status, alone = await cluster.check(checks[0])
    assert status == 429 and alone["rolled_back"] is True and alone["replayed"] is True
    assert [v["remaining"] for v in alone["limits"]] == [5]
    status, refund = await cluster.post(
        "/v1/refund", {"key": "aon:r1", "rule": "basic", "request_id": "aon-r1"}
    )
    assert status == 200 and refund["refunded"] is False, refund
    assert [v["remaining"] for v in (await cluster.usage("aon:r1", "basic"))["limits"]] == [5]


async def test_a_dry_run_batch_that_would_be_rolled_back_shows_what_is_left(
    cluster: Cluster,
) -> None:
    """Nothing was held by a dry run: its rolled-back answer shows the limits as they are."""
    assert (await cluster.check({"key": "aon:dry1", "rule": "basic", "cost": 4}))[0] == 200
    checks = [
        {"key": "aon:dry1", "rule": "basic", "cost": 1, "dry_run": True},
        {"key": "aon:dry2", "rule": "login", "cost": 4, "dry_run": True},  # 4 > 3: denied
    ]
    status, body = await cluster.post("/v1/check/batch", {"checks": checks, "all_or_nothing": True})
    assert status == 200 and body["allowed"] is False, body
    first = body["results"][0]
    assert first["allowed"] is False and first["rolled_back"] is True, first
    assert [v["remaining"] for v in first["limits"]] == [1], first
    assert [v["remaining"] for v in (await cluster.usage("aon:dry1", "basic"))["limits"]] == [1]
