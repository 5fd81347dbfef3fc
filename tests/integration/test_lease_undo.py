"""A lease is never held by a decision nobody received: a node that takes a batch back
past its deadline (node/store/lua/undo.lua) releases the leases it granted, a batch that
reaches Redis past its deadline grants none, and a late answer the router gave up on is
taken back. On a real Redis, through the node's CounterStore and the in-process cluster."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from cluster.local.redis_proc import RedisProcess
from cluster.model.keys import counter_key
from cluster.wire import BatchReply, Checked, encode
from cluster.wire import Op as WireOp
from node.batch.ops import Op, parse_op
from node.store.counter_store import CounterStore, is_expired, undo_entries
from tests.conftest import Cluster, cluster_with_rules, eventually, start_cluster, stop_cluster

LIMIT = ["concurrency", 2, 30_000, 0, "", "", None, 2, None]  # LimitSpec.to_wire()
KEY = counter_key("~inline", "cc", "u:1")

RULES = """
rules:
  exports:
    limits:
      - {algorithm: concurrency, limit: 1, lease: 30s}
  open:
    on_failure: allow
    limits:
      - {algorithm: concurrency, limit: 1, lease: 30s}
"""
cluster = cluster_with_rules(RULES)


@pytest.fixture
async def store(redis_servers: list[RedisProcess]) -> AsyncIterator[CounterStore]:
    client = aioredis.Redis(port=redis_servers[0].port)
    try:
        yield CounterStore(client)
    finally:
        await client.aclose()


def op(cost: int = 1, **extra: Any) -> Op:
    return parse_op(WireOp("check", "u:1", "~inline", [LIMIT], [0], cost=cost, **extra))


async def leases(store: CounterStore) -> list[tuple[bytes, float]]:
    members: Any = await store.client.zrange(KEY, 0, -1, withscores=True)
    return [(bytes(member), float(score)) for member, score in members]


async def test_undo_releases_the_lease_and_keeps_the_fencing_counter(store: CounterStore) -> None:
    await store.run([op()])  # a lease held before
    before = await leases(store)
    check = op(request_id="late-1", record_ttl_ms=60_000)
    [raw] = await store.run([check])
    assert raw[0] == 1 and raw[3 + 6] == 2  # allowed, fencing 2
    assert len(await leases(store)) == 3
    assert await store.undo([(check, raw)]) == 1
    after = await leases(store)
    assert [m for m in after if m[0] != b"f"] == [m for m in before if m[0] != b"f"]
    assert (b"f", -2.0) in after  # the fencing value granted is never handed out again
    [again] = await store.run([check])  # the record went too: a new decision
    assert again[1] == 0 and again[3 + 6] == 3


async def test_a_batch_reaching_redis_past_its_deadline_grants_no_lease(
    store: CounterStore,
) -> None:
    past = int(time.time() * 1000) - 1
    [raw] = await store.run([op()], deadline_ms=past)
    assert is_expired(raw)
    assert await leases(store) == []


async def test_dry_runs_denials_and_replays_leave_nothing_to_undo(store: CounterStore) -> None:
    await store.run([op(), op()])  # both slots held
    denied, dry = op(), op(dry_run=True)
    [raw_denied, raw_dry] = await store.run([denied, dry])
    assert raw_denied[0] == 0 and undo_entries(denied, raw_denied) is None
    assert raw_dry[0] == 0 and undo_entries(dry, raw_dry) is None


async def test_a_late_answer_the_router_gave_up_on_releases_its_lease(cluster: Cluster) -> None:
    key = "late:1"
    rule = cluster.router.rules.get("exports")
    assert rule is not None
    channel = cluster.router.view.clients[cluster.router.view.owner(key)]
    check = WireOp("check", key, "exports", list(rule.wire), [0], cost=1)
    results, epoch = await channel.active.queue.exchange([check])
    assert isinstance(results[0], Checked) and results[0].undo is not None
    late = encode(BatchReply(epoch, channel.spec.id, 0, results))
    channel.active.late_undo.late_answer([check], 200, late)

    async def taken_back() -> bool:
        return channel.late_undos == 1

    await eventually(taken_back)
    status, body = await cluster.check({"key": key, "rule": "exports"})
    assert status == 200 and body["lease"]["fencing"] == 2


@pytest.fixture
async def fast_cluster(redis_servers: list[RedisProcess], tmp_path: Path) -> AsyncIterator[Cluster]:
    started = await start_cluster(redis_servers, tmp_path, node_deadline_ms=1000, rules_yaml=RULES)
    try:
        yield started
    finally:
        await stop_cluster(started)


async def test_a_degraded_answer_acquires_nothing(fast_cluster: Cluster) -> None:
    """n1's Redis hangs (SIGSTOP): checks of its keys answer degraded with no lease,
    fail closed by default or open when the rule says so; once it runs again, what
    waited in its socket is refused past its deadline (or taken back): nothing is held."""
    cluster = fast_cluster
    key = next(k for k in (f"d:{i}" for i in range(100)) if cluster.router.view.owner(k) == "n1")
    hung = cluster.redis[0]
    hung.pause()
    try:
        closed = await cluster.check({"key": key, "rule": "exports"})
        opened = await cluster.check({"key": key, "rule": "open"})
    finally:
        hung.resume()
    assert closed[0] == 429 and closed[1]["degraded"] is True and "lease" not in closed[1]
    assert opened[0] == 200 and opened[1]["degraded"] is True and "lease" not in opened[1]

    async def recovered() -> bool:
        status, body = await cluster.post(
            "/v1/check", {"key": key, "rule": "exports", "dry_run": True}
        )
        return status == 200 and body["degraded"] is False

    await eventually(recovered, within=20)
    for rule in ("exports", "open"):
        usage = await cluster.usage(key, rule)
        assert usage["limits"][0]["held"] == 0, rule
