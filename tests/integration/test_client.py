"""The Python client SDK against a real router, real nodes and real Redis."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest

from cluster.local.redis_proc import free_port
from cluster.sdk.calls import _result, _usage_call
from cluster.sdk.client import (
    AlreadyRefunded,
    AsyncClient,
    BadRequest,
    CheckSpec,
    Client,
    Decision,
    NotFound,
    Unavailable,
)
from tests.conftest import Cluster

INLINE_50 = [{"algorithm": "fixed_window", "limit": 50, "window": "1h"}]


async def test_async_check_allowed_then_denied(cluster: Cluster) -> None:
    async with AsyncClient(cluster.router_url) as client:
        decisions = [await client.check("user:1", "basic") for _ in range(6)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False]
    assert [d.limits[0].remaining for d in decisions] == [4, 3, 2, 1, 0, 0]
    first, denied = decisions[0], decisions[5]
    assert first.key == "user:1" and first.rule == "basic" and first.node in cluster.node_urls
    assert first.retry_after_ms is None and first.denied_by == ()
    assert first.limits[0].algorithm == "fixed_window" and first.limits[0].limit == 5
    assert first.limits[0].max_amount is None and first.limits[0].period is None
    assert denied.denied_by == (0,)
    assert isinstance(denied.retry_after_ms, int) and 0 < denied.retry_after_ms <= 3_600_000
    assert not (denied.replayed or denied.dry_run or denied.degraded or denied.rolled_back)


async def test_async_amounts_are_decimals(cluster: Cluster) -> None:
    async with AsyncClient(cluster.router_url) as client:
        paid = await client.check("merchant:1", "payments", amount="60.25")
        more = await client.check("merchant:1", "payments", amount=Decimal("30.00"))
        too_much = await client.check("merchant:1", "payments", amount=10)
        with pytest.raises(TypeError):
            await client.check("merchant:1", "payments", amount=1.5)  # type: ignore[arg-type]
    day, month = paid.limits
    assert paid.allowed and day.amount_remaining == Decimal("39.75")
    assert day.max_amount == Decimal("100.00") and month.max_amount == Decimal("1000.00")
    assert (day.period, day.timezone, day.limit) == ("day", "Europe/Paris", None)
    assert month.period == "month" and month.amount_remaining == Decimal("939.75")
    assert more.limits[0].amount_remaining == Decimal("9.75")
    assert not too_much.allowed and too_much.denied_by == (0,)
    assert too_much.limits[0].amount_remaining == Decimal("9.75")


async def test_async_idempotency_refund_and_usage(cluster: Cluster) -> None:
    async with AsyncClient(cluster.router_url) as client:
        first = await client.check("merchant:2", "payments", amount="60.25", request_id="pay-1")
        again = await client.check("merchant:2", "payments", amount="60.25", request_id="pay-1")
        assert first.replayed is False and again.replayed is True
        assert again.limits == first.limits
        usage = await client.usage("merchant:2", "payments")
        assert usage.dry_run is True and usage.limits[0].amount_remaining == Decimal("39.75")

        refund = await client.refund("merchant:2", "payments", request_id="pay-1")
        assert refund.refunded is True and refund.request_id == "pay-1"
        assert [g.amount for g in refund.given_back] == [Decimal("60.25")] * 2
        assert [g.count for g in refund.given_back] == [1, 1]
        usage = await client.usage("merchant:2", "payments")
        assert usage.limits[0].amount_remaining == Decimal("100.00")

        with pytest.raises(AlreadyRefunded) as already:
            await client.refund("merchant:2", "payments", request_id="pay-1")
        assert already.value.status == 409
        with pytest.raises(NotFound) as missing:
            await client.refund("merchant:2", "payments", request_id="never")
        assert missing.value.status == 404 and isinstance(missing.value, BadRequest)


async def test_async_bad_request_names_the_fields(cluster: Cluster) -> None:
    async with AsyncClient(cluster.router_url, coalesce=False) as client:
        with pytest.raises(BadRequest) as bad:
            await client.check("user:2", "basic", cost=-1)
        with pytest.raises(BadRequest) as unknown:
            await client.check("user:2", "no-such-rule")
    assert bad.value.status == 400 and bad.value.problem["status"] == 400
    assert [field for field, _ in bad.value.errors] == ["cost"]
    assert unknown.value.errors == [("rule", "unknown rule 'no-such-rule'")]
    assert not isinstance(bad.value, NotFound | AlreadyRefunded)


async def test_async_inline_limits_and_uncoalesced_requests(cluster: Cluster) -> None:
    served = cluster.router.metrics.served
    checks, batches = served("/v1/check"), served("/v1/check/batch")
    async with AsyncClient(cluster.router_url, coalesce=False) as client:
        decisions = await asyncio.gather(
            *(client.check("inline:1", limits=INLINE_50, cost=10) for _ in range(6))
        )
    assert sorted(d.allowed for d in decisions) == [False] + [True] * 5
    assert all(d.rule is None for d in decisions)
    assert served("/v1/check") == checks + 6 and served("/v1/check/batch") == batches


async def test_check_many_all_or_nothing_rolls_back(cluster: Cluster) -> None:
    async with AsyncClient(cluster.router_url) as client:
        results = await client.check_many(
            [CheckSpec("user:3", "basic"), {"key": "user:4", "rule": "login", "cost": 6}],
            all_or_nothing=True,
        )
        assert [r.allowed for r in results] == [False, False]
        assert results[0].rolled_back is True and results[1].rolled_back is False
        assert results[1].denied_by == (0,)
        assert (await client.usage("user:3", "basic")).limits[0].remaining == 5

        ok = await client.check_many(
            [CheckSpec("user:3", "basic"), CheckSpec("user:4", "login")], all_or_nothing=True
        )
        assert [r.allowed for r in ok] == [True, True] and not any(r.rolled_back for r in ok)
        assert await client.check_many([]) == []


async def test_check_many_splits_into_max_batch_chunks(cluster: Cluster) -> None:
    served = cluster.router.metrics.served
    before = served("/v1/check/batch")
    async with AsyncClient(cluster.router_url, max_batch=2) as client:
        results = await client.check_many([CheckSpec("user:5", "basic")] * 7)
        with pytest.raises(ValueError, match="at most 2"):
            await client.check_many([CheckSpec("user:6", "basic")] * 3, all_or_nothing=True)
    assert [r.allowed for r in results] == [True] * 5 + [False] * 2
    assert [r.limits[0].remaining for r in results] == [4, 3, 2, 1, 0, 0, 0]
    assert served("/v1/check/batch") == before + 4


async def test_coalescing_sends_concurrent_checks_as_one_batch(cluster: Cluster) -> None:
    served = cluster.router.metrics.served
    checks, batches = served("/v1/check"), served("/v1/check/batch")
    async with AsyncClient(cluster.router_url) as client:
        decisions = await asyncio.gather(
            *(client.check("hot:1", limits=INLINE_50) for _ in range(200))
        )
    assert sum(d.allowed for d in decisions) == 50
    assert all(isinstance(d, Decision) and d.key == "hot:1" for d in decisions)
    assert {d.limits[0].remaining for d in decisions if d.allowed} == set(range(50))
    assert all(d.retry_after_ms is not None for d in decisions if not d.allowed)
    assert served("/v1/check") == checks
    assert 1 <= served("/v1/check/batch") - batches <= 2


async def test_coalescing_flushes_at_max_batch(cluster: Cluster) -> None:
    served = cluster.router.metrics.served
    batches = served("/v1/check/batch")
    async with AsyncClient(cluster.router_url, max_batch=25) as client:
        decisions = await asyncio.gather(
            *(client.check("hot:2", limits=INLINE_50) for _ in range(100))
        )
    assert sum(d.allowed for d in decisions) == 50
    assert served("/v1/check/batch") - batches == 4


async def test_coalesced_invalid_check_fails_only_its_caller(cluster: Cluster) -> None:
    served = cluster.router.metrics.served
    checks, batches = served("/v1/check"), served("/v1/check/batch")
    async with AsyncClient(cluster.router_url) as client:
        results = await asyncio.gather(
            *(client.check("mixed:1", "basic") for _ in range(3)),
            client.check("mixed:1", "basic", cost=-1),
            *(client.check("mixed:1", "basic") for _ in range(3)),
            return_exceptions=True,
        )
    bad = results[3]
    assert isinstance(bad, BadRequest) and [f for f, _ in bad.errors] == ["cost"]
    good = [r for i, r in enumerate(results) if i != 3]
    assert all(isinstance(r, Decision) for r in good)
    assert [r.allowed for r in good if isinstance(r, Decision)].count(True) == 5
    # One refused batch, the offending check alone, the six others together again.
    assert served("/v1/check/batch") == batches + 2 and served("/v1/check") == checks + 1


def _sync_session(url: str) -> None:
    with Client(url) as client:
        decisions = [client.check("sync:1", "basic") for _ in range(6)]
        assert [d.limits[0].remaining for d in decisions] == [4, 3, 2, 1, 0, 0]
        assert decisions[5].allowed is False and isinstance(decisions[5].retry_after_ms, int)

        paid = client.check("sync:2", "payments", amount=Decimal("60.25"), request_id="p-1")
        assert paid.limits[0].amount_remaining == Decimal("39.75")
        assert client.check("sync:2", "payments", amount="60.25", request_id="p-1").replayed
        assert client.usage("sync:2", "payments").limits[1].amount_remaining == Decimal("939.75")
        refund = client.refund("sync:2", "payments", request_id="p-1")
        assert refund.refunded and refund.given_back[0].amount == Decimal("60.25")
        with pytest.raises(AlreadyRefunded):
            client.refund("sync:2", "payments", request_id="p-1")
        with pytest.raises(NotFound):
            client.refund("sync:2", "payments", request_id="never")
        with pytest.raises(BadRequest) as bad:
            client.check("sync:3", "basic", cost=-1)
        assert bad.value.status == 400 and bad.value.errors[0][0] == "cost"

        many = client.check_many(
            [CheckSpec("sync:4", "basic"), CheckSpec("sync:5", "login", cost=6)],
            all_or_nothing=True,
        )
        assert [r.rolled_back for r in many] == [True, False]
        # The connection survives errors and is reused; close() then reconnects.
        client.close()
        assert client.usage("sync:1", "basic").limits[0].remaining == 0


async def test_sync_client(cluster: Cluster) -> None:
    await asyncio.to_thread(_sync_session, cluster.router_url)


async def test_unavailable_when_nothing_listens() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for coalesce in (True, False):
        async with AsyncClient(url, timeout=1.0, coalesce=coalesce) as client:
            with pytest.raises(Unavailable):
                await client.check("k", "basic")
            with pytest.raises(Unavailable):
                await client.usage("k", "basic")

    def blocking() -> None:
        with Client(url, timeout=1.0) as client, pytest.raises(Unavailable) as caught:
            client.check("k", "basic")
        assert "cannot reach the router" in str(caught.value)

    await asyncio.to_thread(blocking)


def test_one_boundary_translates_every_answer() -> None:
    # The pure function both clients hand (status, body) to; no server needed.
    call = _usage_call("k", "basic")
    problem = b'{"type":"https://shardlimit.dev/problems/already-refunded","status":409}'
    with pytest.raises(AlreadyRefunded):
        _result(call, 409, problem)
    with pytest.raises(BadRequest) as other_conflict:
        _result(call, 409, b'{"type":"https://shardlimit.dev/problems/last-node"}')
    assert type(other_conflict.value) is BadRequest
    with pytest.raises(BadRequest) as not_json:
        _result(call, 413, b"<html>too large</html>")
    assert not_json.value.status == 413 and not_json.value.errors == []
    for status, body in ((503, b'{"detail":"node down"}'), (502, b"<html/>"), (200, b"nope")):
        with pytest.raises(Unavailable) as down:
            _result(call, status, body)
        assert down.value.status == status
    with pytest.raises(Unavailable):
        _result(call, 200, b'{"allowed": true}')  # not a decision
