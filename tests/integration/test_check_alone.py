"""A check of one limit without a record takes batch.lua's short way (the algorithm's
`alone`). It must answer exactly as the general way (eval, then commit) would: the
same rows, the same undo entries, the same counter left in Redis."""

from __future__ import annotations

from typing import Any, cast

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


LEASES = [{"algorithm": "concurrency", "limit": 2, "lease": "30s"}]
# (cost, dry_run): a lease taken, a dry run, a look, the second lease, one denied (the
# two held), a look at the full set.
LEASE_STEPS = [(1, False), (1, True), (0, False), (1, False), (1, False), (0, False)]


def lease_op(kind: str, key: str, cost: int = 1, dry_run: bool = False, **extra: Any) -> Op:
    wire = [spec.to_wire() for spec in specs(LEASES)]
    return parse_op(WireOp(kind, key, "pool", wire, [0], cost=cost, dry_run=dry_run, **extra))


def lease_comparable(raw: list[Any]) -> list[Any]:
    """A concurrency reply without its `replayed` flag and nonce (drawn per check), its
    undo entries reduced to the lease's fencing value."""
    out = [raw[0], *raw[2:10]]
    if len(raw) > 11:
        (entry,) = msgspec.msgpack.decode(raw[11])
        member = entry[2].decode() if isinstance(entry[2], bytes) else entry[2]
        out.append(member.split(":")[0])
    return out


async def test_a_concurrency_check_alone_answers_as_the_general_way(store: CounterStore) -> None:
    replies = []
    for step, (cost, dry_run) in enumerate(LEASE_STEPS):
        alone, general = await store.run(
            [
                lease_op("check", "alone:2", cost, dry_run),
                lease_op(
                    "check", "general:2", cost, dry_run, request_id=f"r{step}", record_ttl_ms=60_000
                ),
            ]
        )
        assert lease_comparable(alone) == lease_comparable(general), step
        replies.append(alone)
    assert [r[0] for r in replies] == [1, 1, 1, 1, 0, 1]
    assert [r[4] for r in replies] == [1, 1, 1, 2, 2, 2]  # leases held
    assert [r[9] for r in replies] == [1, -1, -1, 2, -1, -1]  # fencing when acquired
    client: aioredis.Redis = store.client
    shape = specs(LEASES)[0].shape
    for key in ("alone:2", "general:2"):
        members = cast(list[bytes], await client.zrange(counter_key("pool", shape, key), 0, -1))
        assert [m.split(b":")[0] for m in members] == [b"f", b"1", b"2"]


async def test_a_release_in_the_batch_of_checks_frees_its_slot_at_once(store: CounterStore) -> None:
    (first,) = await store.run([lease_op("check", "mixed:1")])
    second, _ = await store.run([lease_op("check", "mixed:1"), lease_op("check", "mixed:2")])
    lease = [first[9], first[10], 0]
    # The release runs in the same batch.lua call as the checks, in the batch's order.
    held, released, again, twice = await store.run(
        [
            lease_op("check", "mixed:1", cost=0),
            lease_op("release", "mixed:1", lease=lease),
            lease_op("check", "mixed:1"),
            lease_op("release", "mixed:1", lease=lease),
        ]
    )
    assert held[4] == 2 and second[4] == 2
    assert released[0] == 2  # released
    assert again[0] == 1 and again[4] == 2 and again[9] == 3  # the freed slot, a new fencing
    assert twice[0] == 0  # not held any more: nothing changed
