"""Taking back a check whose answer came too late (node/store/lua/undo.lua), on a real Redis.

A node whose results for a batch are ready only after the batch's deadline takes
back what those checks consumed before answering `expired`. For every algorithm the
counters must return to exactly where they were, and an idempotency record (with its
hold) must disappear, so the router may send the check again as a new decision.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from cluster.local.redis_proc import RedisProcess
from cluster.model.errors import Problems
from cluster.model.keys import record_key
from cluster.model.limits import LimitSpec, parse_limit
from cluster.wire import BatchReply, Checked, encode
from cluster.wire import Op as WireOp
from node.batch.ops import Op, parse_op
from node.store.counter_store import HOLDS_KEY, CounterStore, is_expired, undo_entries
from tests.conftest import Cluster, eventually

LIMITS: dict[str, list[dict[str, Any]]] = {
    "fixed_window": [{"algorithm": "fixed_window", "limit": 10, "window": "1h"}],
    "sliding_log": [{"algorithm": "sliding_log", "limit": 10, "window": "1h"}],
    "sliding_window": [{"algorithm": "sliding_window", "limit": 10, "window": "1h"}],
    "token_bucket": [{"algorithm": "token_bucket", "rate": 1, "period": "1h", "burst": 10}],
    "leaky_bucket": [{"algorithm": "leaky_bucket", "rate": 1, "period": "1h", "capacity": 10}],
    "calendar": [
        {
            "algorithm": "calendar",
            "period": "day",
            "timezone": "Europe/Paris",
            "max_count": 10,
            "max_amount": "100.00",
        },
    ],
    "two_limits": [
        {"algorithm": "fixed_window", "limit": 10, "window": "1h"},
        {"algorithm": "token_bucket", "rate": 1, "period": "1h", "burst": 10},
    ],
}


@pytest.fixture
async def store(redis_servers: list[RedisProcess]) -> AsyncIterator[CounterStore]:
    client = aioredis.Redis(port=redis_servers[0].port)
    try:
        yield CounterStore(client)
    finally:
        await client.aclose()


def specs(limits: list[dict[str, Any]]) -> list[LimitSpec]:
    problems = Problems()
    parsed = [parse_limit(limit, "limit", problems) for limit in limits]
    problems.raise_if_any()
    return [spec for spec in parsed if spec is not None]


def op(limits: list[dict[str, Any]], cost: int, **extra: Any) -> Op:
    parsed = specs(limits)
    wire = [spec.to_wire() for spec in parsed]
    amounts = [250 if spec.algorithm == "calendar" else 0 for spec in parsed]
    return parse_op(
        WireOp(
            "check",
            "undo:1",
            "~inline",
            wire,
            amounts if cost else [0] * len(wire),
            cost=cost,
            **extra,
        )
    )


async def state(store: CounterStore, limits: list[dict[str, Any]]) -> list[list[int]]:
    [raw] = await store.run([op(limits, 0)])
    n = raw[2]
    # per limit: remaining and amount remaining (reset times move with the clock)
    return [[raw[3 + 8 * i + 2], raw[3 + 8 * i + 7]] for i in range(n)]


@pytest.mark.parametrize("algorithm", sorted(LIMITS))
async def test_undo_gives_back_exactly_what_the_check_consumed(
    store: CounterStore, algorithm: str
) -> None:
    limits = LIMITS[algorithm]
    await store.run([op(limits, 2)])  # something there before
    before = await state(store, limits)
    check = op(limits, 3)
    [raw] = await store.run([check])
    assert raw[0] == 1 and undo_entries(check, raw) is not None
    assert await state(store, limits) != before
    assert await store.undo([(check, raw)]) == 1
    assert await state(store, limits) == before


async def test_undo_drops_the_record_and_hold_so_the_check_can_be_sent_again(
    store: CounterStore,
) -> None:
    limits = LIMITS["fixed_window"]
    held = op(limits, 1, request_id="req-1", record_ttl_ms=60_000, hold_ms=10_000)
    before = await state(store, limits)
    [raw] = await store.run([held])
    record = record_key("~inline", "req-1", "undo:1")
    assert await store.client.exists(record) == 1
    assert await store.client.zcard(HOLDS_KEY) == 1
    await store.undo([(held, raw)])
    assert await store.client.exists(record) == 0
    assert await store.client.zcard(HOLDS_KEY) == 0
    assert await state(store, limits) == before
    # Sent again with the same request id: a new decision, not a replay.
    [again] = await store.run([held])
    assert again[0] == 1 and again[1] == 0


async def test_a_check_is_given_back_only_where_its_record_is(
    redis_servers: list[RedisProcess],
) -> None:
    """A batch ran on a primary that was then failed over before it replicated; its late
    answer is taken back on the promoted one, which never held it: nothing is given back
    there (counting it back would lose a check someone else was admitted for). A check
    without a request_id cannot tell, and after a failover it is left as it is."""
    limits = LIMITS["fixed_window"]
    old_client, new_client = (aioredis.Redis(port=s.port) for s in redis_servers[:2])
    try:
        old, new = CounterStore(old_client), CounterStore(new_client)
        for store in (old, new):  # what both held before the failover
            await store.run([op(limits, 2)])
        before = await state(new, limits)
        held = op(limits, 1, request_id="req-2", record_ttl_ms=60_000)
        bare = op(limits, 1)
        raws = await old.run([held, bare])
        assert await new.undo(list(zip([held, bare], raws, strict=True)), recorded_only=True) == 0
        assert await state(new, limits) == before
        # Where the record is, the check is given back.
        assert await old.undo([(held, raws[0])], recorded_only=True) == 1
        assert await state(old, limits) == [[before[0][0] - 1, before[0][1]]]
    finally:
        await old_client.aclose()
        await new_client.aclose()


async def test_nothing_to_undo_for_denials_dry_runs_and_replays(store: CounterStore) -> None:
    limits = LIMITS["fixed_window"]
    denied = op(limits, 11)  # over the limit
    dry = op(limits, 1, dry_run=True)
    [raw_denied, raw_dry] = await store.run([denied, dry])
    assert raw_denied[0] == 0 and undo_entries(denied, raw_denied) is None
    assert raw_dry[0] == 1 and undo_entries(dry, raw_dry) is None
    assert await store.undo([(denied, raw_denied), (dry, raw_dry)]) == 0
    first = op(limits, 1, request_id="req-2", record_ttl_ms=60_000)
    await store.run([first])
    [replayed] = await store.run([first])
    assert replayed[1] == 1 and undo_entries(first, replayed) is None


async def test_a_check_reaching_redis_after_its_deadline_is_not_applied(
    store: CounterStore,
) -> None:
    limits = LIMITS["fixed_window"]
    before = await state(store, limits)
    past = int(time.time() * 1000) - 1
    [raw] = await store.run([op(limits, 1)], deadline_ms=past)
    assert is_expired(raw)
    assert await state(store, limits) == before
    [raw] = await store.run([op(limits, 1)], deadline_ms=past + 60_000)
    assert raw[0] == 1


async def test_a_late_answer_the_router_gave_up_on_is_taken_back(cluster: Cluster) -> None:
    """A node stopped between finishing a batch and answering it answers after the router
    gave up (and answered degraded): the router takes back what that answer consumed."""
    key = "late:1"
    channel = cluster.router.view.clients[cluster.router.view.owner(key)]
    limits = LIMITS["fixed_window"]
    check = WireOp(
        "check",
        key,
        "~inline",
        [lim.to_wire() for lim in specs(limits)],
        [0],
        cost=4,
        request_id="late-req",
        record_ttl_ms=60_000,
    )
    # What the node answers to a batch it applied; here the router has given up on it.
    results, epoch = await channel.active.queue.exchange([check])
    assert isinstance(results[0], Checked) and results[0].undo is not None
    late = encode(BatchReply(epoch, channel.spec.id, 0, results))
    channel.active.late_undo.late_answer([check], 200, late)

    async def taken_back() -> bool:
        return channel.late_undos == 1

    await eventually(taken_back)
    status, body = await cluster.check({"key": key, "limits": limits, "cost": 0})
    assert status == 200 and body["limits"][0]["remaining"] == 10
    # Its idempotency record went too: the same request id is a new decision.
    _, again = await cluster.check(
        {"key": key, "limits": limits, "cost": 4, "request_id": "late-req"}
    )
    assert again["replayed"] is False and again["limits"][0]["remaining"] == 6
    assert channel.late_undo_failures == 0
