"""Taking back a check whose answer came too late (node/lua/undo.lua), on a real Redis.

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

from cluster.errors import Problems
from cluster.keys import record_key
from cluster.limits import parse_limit
from cluster.redis_proc import RedisProcess
from cluster.wire import Op as WireOp
from node.ops import Op, parse_op
from node.store import HOLDS_KEY, CounterStore, is_expired, undo_entries

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


def op(limits: list[dict[str, Any]], cost: int, **extra: Any) -> Op:
    problems = Problems()
    specs = [parse_limit(limit, "limit", problems) for limit in limits]
    problems.raise_if_any()
    wire = [spec.to_wire() for spec in specs if spec is not None]
    amounts = [250 if spec.algorithm == "calendar" else 0 for spec in specs if spec is not None]
    return parse_op(WireOp("check", "undo:1", "~inline", wire,
                            amounts if cost else [0] * len(wire), cost=cost, **extra))  # fmt: skip


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
