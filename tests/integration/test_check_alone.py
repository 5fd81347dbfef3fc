"""A check of one limit without a record takes batch.lua's short way (the algorithm's
`alone`). It must answer exactly as the general way (eval, then commit) would: the
same rows, the same undo entries, the same counter left in Redis."""

from __future__ import annotations

from typing import Any

import msgspec
import redis.asyncio as aioredis

from cluster.model.keys import counter_key
from cluster.wire import Op as WireOp
from node.batch.ops import Op, parse_op
from node.store.counter_store import CounterStore
from tests.integration.test_undo import specs, store

__all__ = ["store"]  # the fixture, shared with test_undo.py

FIXED = [{"algorithm": "fixed_window", "limit": 10, "window": "1h"}]
# (cost, dry_run): admitted, a dry run, a look (cost 0), up to the limit, denied,
# a cost over the limit, and a look at a full window.
STEPS = [(3, False), (2, True), (0, False), (7, False), (1, False), (11, False), (0, False)]


def check(key: str, cost: int, dry_run: bool, request_id: str | None) -> Op:
    wire = [spec.to_wire() for spec in specs(FIXED)]
    return parse_op(
        WireOp(
            "check",
            key,
            "~inline",
            wire,
            [0],
            cost=cost,
            dry_run=dry_run,
            request_id=request_id,
            record_ttl_ms=60_000 if request_id else 0,
        )
    )


def comparable(raw: list[Any], key: str) -> list[Any]:
    """A reply without its `replayed` flag, its undo entries unpacked, the counter's
    name checked and left out."""
    out = [raw[0], *raw[2:11]]
    if len(raw) > 11:
        entries = msgspec.msgpack.decode(raw[11])
        out.append([[e[0].decode() if isinstance(e[0], bytes) else e[0], *e[1:]] for e in entries])
        assert out[-1][0][0] == counter_key("~inline", specs(FIXED)[0].shape, key)
        out[-1][0][0] = "counter"
    return out


async def test_a_check_alone_answers_as_the_general_way(store: CounterStore) -> None:
    replies = []
    for step, (cost, dry_run) in enumerate(STEPS):
        # One batch, so both read the same TIME: the short way (no record) beside
        # the general way (a request_id makes a record, which the short way never does).
        alone, general = await store.run(
            [check("alone:1", cost, dry_run, None), check("general:1", cost, dry_run, f"r{step}")]
        )
        assert comparable(alone, "alone:1") == comparable(general, "general:1"), step
        replies.append(alone)
    assert [r[0] for r in replies] == [1, 1, 1, 1, 0, 0, 1]
    assert [r[5] for r in replies] == [7, 5, 7, 0, 0, 0, 0]
    assert [len(r) > 11 for r in replies] == [True, False, False, True, False, False, False]
    client: aioredis.Redis = store.client
    shape = specs(FIXED)[0].shape
    names = [counter_key("~inline", shape, key) for key in ("alone:1", "general:1")]
    assert await client.mget(names) == [b"10", b"10"]
    ttl_alone, ttl_general = [await client.pttl(name) for name in names]
    assert abs(ttl_alone - ttl_general) < 1000
