"""Handing keys over between replicated shards (docs/resharding.md, "Resharding with
replicas").

A shard's replicas follow its primary asynchronously: a key copied to a target lives
for a while in the target's primary alone, and a failover of the target then would lose
it, counts and all, were the source's copy already gone. So, while the target may have
replicas, a source keeps its copy (node/migration/direct.py) and drops it only once the
target answered
which of those keys its primary holds, behind a *replica barrier*: on the same
connection, a write of its own (WAIT waits for the writes of its connection: an INCR,
then a DEL, so no key is left) and a WAIT for `needed` replicas. Replication is one
ordered stream, so a replica that acknowledged that write holds every key restored
before it.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis

__all__ = ["BARRIER_KEY", "BARRIER_WAIT_MS", "held"]

BARRIER_KEY = "sl|barrier"  # node-local (outside DATA_KEYS_PATTERN), deleted at once
BARRIER_WAIT_MS = 2_000  # a replica acknowledges in about a millisecond when it is up


async def held(
    client: aioredis.Redis,
    keys: Sequence[str],
    replicated: bool,
    wait_ms: int = BARRIER_WAIT_MS,
    needed: int = 1,
) -> tuple[list[str], int]:
    """(the keys of `keys` this Redis lacks, how many replicas acknowledged the barrier
    behind the others: -1 when `replicated` is False and none was asked), on one
    connection. One EXISTS counts them all; only when some lack (a copy that went
    wrong) are they asked one by one, again before a barrier."""
    missing, acked = await _held(client, keys, replicated, wait_ms, needed, one_by_one=False)
    if missing:
        return await _held(client, keys, replicated, wait_ms, needed, one_by_one=True)
    return missing, acked


async def _held(
    client: aioredis.Redis,
    keys: Sequence[str],
    replicated: bool,
    wait_ms: int,
    needed: int,
    *,
    one_by_one: bool,
) -> tuple[list[str], int]:
    pipe = client.pipeline(transaction=False)
    if one_by_one:
        for key in keys:
            pipe.exists(key)
    elif keys:
        pipe.exists(*keys)  # how many of them exist
    if replicated:
        pipe.incr(BARRIER_KEY)
        pipe.delete(BARRIER_KEY)
        pipe.wait(needed, max(1, wait_ms))  # WAIT 0 would wait for ever
    replies = await pipe.execute()
    acked = int(replies[-1]) if replicated else -1
    if one_by_one:
        found = replies[: len(keys)]
        return [key for key, here in zip(keys, found, strict=True) if not here], acked
    return ([] if not keys or replies[0] == len(keys) else list(keys)), acked
