"""The batch script's arguments: common checks packed inline come out as the general
packing makes them."""

from __future__ import annotations

import random

import redis.asyncio as aioredis

from cluster import wire
from cluster.model.limits import LimitSpec
from node.batch.ops import parse_op
from node.store.counter_store import CounterStore

LIMITS = [
    [LimitSpec("fixed_window", 10, 3_600_000).to_wire()],
    [LimitSpec("token_bucket", 5, 1000, rate=3).to_wire()],
    [LimitSpec("sliding_window", 7, 60_000).to_wire()],
    [
        LimitSpec("fixed_window", 10, 3_600_000).to_wire(),
        LimitSpec("token_bucket", 5, 1000, rate=3).to_wire(),
    ],
]


def test_inline_packing_matches_the_general_one() -> None:
    rng = random.Random(7)
    ops = []
    for i in range(400):
        limits = [list(limit) for limit in rng.choice(LIMITS)]
        wire_op = wire.Op(
            "check",
            f"k{i}",
            rng.choice(["_", "api"]),
            limits,
            [rng.choice([0, 1])] * len(limits),
            rng.choice([0, 1, 3]),
            rng.choice([None, f"r{i}"]),
            rng.choice([False, True]),
            fingerprint=rng.choice([None, "abc"]),
        )
        ops.append(parse_op(wire_op))
    store = CounterStore(aioredis.Redis())
    store._estimated_now_ms = lambda: 1_700_000_000_000  # type: ignore[method-assign]
    first = store.plan(ops, 5).calls[0]  # rules and their arguments worked out
    inline = store.plan(ops, 5).calls[0]
    for rule in store.calls.rules.by_limits.values():
        rule.single = None  # every check through _check_entry
    general = store.plan(ops, 5).calls[0]
    assert inline[0] is general[0] and inline[1:] == general[1:] == first[1:]
