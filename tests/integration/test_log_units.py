"""A batch whose sliding_log checks would add more log entries than one script call
should (node/store/script_calls.py LOG_UNITS_PER_CALL) runs as several batch.lua calls,
on a real Redis: every check answered in its place, exactly as one call would."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from cluster.local.redis_proc import RedisProcess
from cluster.model.errors import Problems
from cluster.model.keys import counter_key
from cluster.model.limits import parse_limit
from cluster.wire import Op as WireOp
from node.batch.ops import Op, parse_op
from node.store.counter_store import CounterStore
from node.store.script_calls import LOG_UNITS_PER_CALL

pytestmark = pytest.mark.timeout(60)

LOG = {"algorithm": "sliding_log", "limit": 10_000, "window": "1h"}
WINDOW = {"algorithm": "fixed_window", "limit": 5, "window": "1h"}


@pytest.fixture
async def client(redis_servers: list[RedisProcess]) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis(port=redis_servers[0].port)
    try:
        await client.flushall()
        yield client
    finally:
        await client.aclose()


def op(key: str, limit: dict[str, Any], cost: int) -> Op:
    problems = Problems()
    spec = parse_limit(limit, "limit", problems)
    problems.raise_if_any()
    assert spec is not None
    return parse_op(WireOp("check", key, "~inline", [spec.to_wire()], [0], cost=cost))


async def evalsha_calls(client: aioredis.Redis) -> int:
    """EVALSHA calls Redis ran so far (the scripts loaded before: see `warm`)."""
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def warm(store: CounterStore) -> CounterStore:
    """The store with its scripts loaded in Redis (a first call loads them, then retries):
    one per set of algorithms a call holds."""
    await store.run([op("warm:log", LOG, 1), op("warm:window", WINDOW, 1)])
    await store.run([op("warm:log", LOG, 1)])
    return store


async def test_heavy_log_checks_are_split_over_calls_and_answered_in_place(
    client: aioredis.Redis,
) -> None:
    store = await warm(CounterStore(client))
    costs = [9_000, 9_001, 9_002, 9_003, 9_004]
    ops = [op(f"log:{i}", LOG, cost) for i, cost in enumerate(costs)]
    ops.insert(2, op("window:1", WINDOW, 2))  # a light check between them
    assert sum(costs) > 2 * LOG_UNITS_PER_CALL
    before = await evalsha_calls(client)
    results = await store.run(ops)
    # 9,000 + 9,001 (+ the light one), 9,002 + 9,003, 9,004: three calls, not one.
    assert await evalsha_calls(client) - before == 3
    assert [r[0] for r in results] == [1] * 6  # all admitted
    remaining = [r[3 + 2] for r in results]  # each check's first limit: remaining now
    assert remaining == [1_000, 999, 3, 998, 997, 996]
    for i, cost in enumerate(costs):
        key = counter_key("~inline", ops[i if i < 2 else i + 1].limits[0].shape, f"log:{i}")
        assert await client.zcard(key) == cost


async def test_light_batches_stay_one_call(client: aioredis.Redis) -> None:
    store = await warm(CounterStore(client))
    ops = [op(f"log:{i}", LOG, 3) for i in range(100)]
    before = await evalsha_calls(client)
    results = await store.run(ops)
    assert await evalsha_calls(client) - before == 1
    assert all(r[0] == 1 for r in results)
