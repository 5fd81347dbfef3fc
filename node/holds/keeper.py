"""All-or-nothing holds on a node: settled once, where their key lives (docs/resharding.md).

A hold is an entry of the node's holds set (`sl|holds`, scored by when it runs
out) naming an idempotency record and its counters. When it runs out, the node's
sweeper learns the batch's fate from the coordinator, then settles the hold:

- where the key lives: if a migration moved the key away, the record and its
  counters are on the new owner, so the hold is settled there (POST
  HOLDS_SETTLE_PATH, which imports the keys first if they were not copied yet);
  the local frozen copy is never touched;
- counted as a batch of the current epoch, so a topology change is acknowledged
  only once a settle that began under the old epoch has reached Redis;
- then, for a "commit", reported to the coordinator, whose record stays (without
  expiry) until every hold of the batch reported itself settled;
- and only then removed from the holds set. Every step is safe to repeat:
  commit.lua and refund.lua (only_held) act on a held record only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from redis.exceptions import RedisError

from cluster import wire
from cluster.model.keys import HOLDS_KEY, hold_id_of, limit_key_of
from node.errors import NodeError, PeerError, ShardMovedOn
from node.holds.coordinator_records import CoordinatorRecords
from node.migration.migrator import Migrator
from node.migration.peer_client import PeerClient
from node.store.counter_store import CounterStore
from node.store.limit_args import LIMIT_ARGS
from node.topology.current import CurrentTopology
from node.topology.epoch_gate import EpochGate
from node.topology.ownership import Role

log = logging.getLogger("shardlimit.node")
UNRESOLVED_RETRY_MS = 1_000  # a hold whose fate or owner cannot be reached: retried after
SWEEP_EVERY_S = 0.25
SWEEP_BATCH = 200


def valid_entry(entry: Any) -> bool:
    """A hold entry as batch.lua stores it: {"k": [record, counters...], "a": [ints]}."""
    if not isinstance(entry, dict):
        return False
    keys, args = entry.get("k"), entry.get("a")
    if not (isinstance(keys, list) and keys and all(isinstance(k, str) for k in keys)):
        return False
    if not (
        isinstance(args, list) and all(type(a) is int for a in args) and len(args) % LIMIT_ARGS == 0
    ):
        return False
    owner = limit_key_of(keys[0])
    return hold_id_of(keys[0]) is not None and all(limit_key_of(k) == owner for k in keys)


class HoldKeeper:
    """Settles this node's holds; `records` learns a held batch's fate from its
    coordinator and takes the reports of settled holds."""

    def __init__(
        self,
        current: CurrentTopology,
        store: CounterStore,
        migrator: Migrator,
        peers: PeerClient,
        gate: EpochGate,
        records: CoordinatorRecords,
        catch_up: Callable[[], Awaitable[None]],
    ) -> None:
        self.current = current
        self.store = store
        self.migrator = migrator  # pulls a key moving here before its hold is settled
        self.peers = peers
        self.gate = gate
        self.records = records
        # Adopts the topology the shard keeps when another endpoint of it is ahead: before
        # a sweep settles anything, and when a settle was refused for an older one.
        self.catch_up = catch_up
        self.settled_here = 0  # holds settled on this node's Redis
        self.settled_elsewhere = 0  # holds settled on the node their key moved to

    async def settle_here(self, entry: dict[str, Any], decision: str) -> bool:
        """Settle one hold on this node if it serves the key (importing it first when
        the key is moving here); False if another node serves it. Placed by the shard's
        topology: when another endpoint of it adopted a newer one, by that one."""
        try:
            return await self._settle_here(entry, decision)
        except ShardMovedOn:
            await self.catch_up()
        return await self._settle_here(entry, decision)

    async def _settle_here(self, entry: dict[str, Any], decision: str) -> bool:
        ownership = self.current.ownership
        record = entry["k"][0]
        limit_key = limit_key_of(record)
        assert limit_key is not None
        role, source = ownership.role(limit_key) if ownership else (Role.OWN, None)
        if role is Role.MOVED:
            return False
        epoch = self.current.epoch
        # Counted like a batch: no topology change is acknowledged while it runs.
        async with self.gate.hold(epoch):
            if role is Role.IMPORT and source is not None and ownership is not None:
                spec = ownership.node_spec(source)
                if spec is None:
                    raise PeerError(f"previous owner {source} unknown")
                await self.migrator.pull(ownership, spec.urls, list(entry["k"]))
            store = self.store
            if decision == "commit":
                await store.commit_hold(record, epoch)
            else:
                await store.refund_hold(entry["k"], entry["a"], epoch)
        self.settled_here += 1
        return True

    async def _settle(self, entry: dict[str, Any], decision: str) -> bool:
        """Settle where the key lives; False when that cannot be done now."""
        if await self.settle_here(entry, decision):
            return True
        ownership = self.current.ownership
        assert ownership is not None
        limit_key = limit_key_of(entry["k"][0])
        assert limit_key is not None
        owner = ownership.topology.partitioner.owner(limit_key)
        spec = ownership.node_spec(owner)
        if spec is None:
            return False
        try:
            body = await self.peers.post(
                spec.urls, wire.HOLDS_SETTLE_PATH, {"holds": [[entry, decision]]}, timeout_s=5.0
            )
        except PeerError as exc:
            log.warning("hold of %s: its owner %s cannot settle it now: %s", limit_key, owner, exc)
            return False
        done = isinstance(body, dict) and body.get("settled") == [True]
        if done:
            self.settled_elsewhere += 1
        return done

    async def _report(self, batch: str, coordinator: str, hold: str) -> bool:
        """Tell a committed batch's coordinator that one of its holds is settled."""
        where = self.records.where_decided(coordinator)
        if where == self.current.node_id:
            return await self.store.settled(batch, [hold]) >= 0  # -1: handed over
        ownership = self.current.ownership
        spec = ownership.node_spec(where) if ownership and where else None
        if spec is None:
            return True  # the coordinator left long ago: nobody keeps its record
        try:
            await self.peers.post(
                spec.urls, wire.DECISION_PATH, {"batch": batch, "settled": [hold]}, timeout_s=1.0
            )
        except PeerError:
            return False
        return True

    async def sweep(self) -> int:
        """Settle holds that ran out; how many were settled."""
        client = self.store.client
        async with client.pipeline(transaction=False) as pipe:
            pipe.time()
            pipe.zrange(HOLDS_KEY, 0, 0, withscores=True)
            (seconds, micros), first = await pipe.execute()
        now_ms = seconds * 1000 + micros // 1000
        if not first or first[0][1] > now_ms:
            return 0  # none ran out, learnt in one round trip: the common case, 4 times a second
        due = await client.zrangebyscore(HOLDS_KEY, "-inf", now_ms, start=0, num=SWEEP_BATCH)
        if due:
            await self.catch_up()  # settle by where the shard's topology places each key
        settled = 0
        for raw in due:
            assert isinstance(raw, bytes | str)
            member = raw.decode() if isinstance(raw, bytes) else raw
            entry = orjson.loads(raw)
            batch, coordinator = entry.get("b"), entry.get("c")
            decision: str | None = "abort"
            if batch is not None:
                decision = await self.records.resolve(batch, coordinator)
            done = decision is not None and await self._settle(entry, decision)
            if done and decision == "commit" and batch is not None:
                hold = hold_id_of(entry["k"][0])
                assert hold is not None
                done = await self._report(batch, coordinator, hold)
            if not done:
                await client.zadd(HOLDS_KEY, {member: now_ms + UNRESOLVED_RETRY_MS}, xx=True)
                continue
            await client.zrem(HOLDS_KEY, member)
            settled += 1
        return settled

    async def run_forever(self) -> None:
        while True:
            try:
                while await self.sweep() > 0:
                    pass
            except (RedisError, OSError, NodeError) as exc:
                log.warning("hold sweep failed, will retry: %s", exc)
            await asyncio.sleep(SWEEP_EVERY_S)  # sweep cadence

    async def settle_for_peer(self, holds: Any) -> list[bool] | str:
        """The HOLDS_SETTLE_PATH endpoint: [[entry, decision], ...] -> settled each."""
        if not isinstance(holds, list) or len(holds) > SWEEP_BATCH:
            return f"holds must be a list of at most {SWEEP_BATCH} [entry, decision]"
        for item in holds:
            if not (isinstance(item, list) and len(item) == 2 and valid_entry(item[0])):
                return "each hold is [entry, decision]"
            if item[1] not in ("commit", "abort"):
                return "decision must be 'commit' or 'abort'"
        done: list[bool] = []
        for entry, decision in holds:
            try:
                done.append(await self.settle_here(entry, decision))
            except ShardMovedOn:  # the shard kept moving on: its sender sends it again
                done.append(False)
        return done

    async def hand_over(self, moving_to: Callable[[str], str | None]) -> int:
        """After a source's copy: give the holds of keys that moved away to their new
        owners (ZADD NX there, same deadline), then forget them here. A removed node
        leaves no hold behind; until then the sweeper above settles them remotely."""
        client = self.store.client
        ownership = self.current.ownership
        if ownership is None:
            return 0
        raw_all: list[Any] = await client.zrange(HOLDS_KEY, 0, -1, withscores=True)
        by_target: dict[str, list[tuple[str, int]]] = {}
        for raw, score in raw_all:
            member = raw.decode() if isinstance(raw, bytes) else str(raw)
            limit_key = limit_key_of(orjson.loads(member)["k"][0])
            target = moving_to(limit_key) if limit_key is not None else None
            if target is not None:
                by_target.setdefault(target, []).append((member, int(score)))
        given = 0
        for target, entries in by_target.items():
            spec = ownership.node_spec(target)
            if spec is None:
                continue
            await self.peers.post(
                spec.urls, wire.HOLDS_ADOPT_PATH, {"holds": [list(e) for e in entries]}
            )
            await client.zrem(HOLDS_KEY, *[member for member, _ in entries])
            given += len(entries)
        return given

    async def adopt(self, holds: Any) -> int | str:
        """The HOLDS_ADOPT_PATH endpoint: [[entry JSON, deadline ms], ...] from a source."""
        if not isinstance(holds, list):
            return "holds must be a list of [entry, deadline]"
        mapping: dict[str, int] = {}
        for item in holds:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                return "each hold is [entry JSON, deadline ms]"
            if type(item[1]) is not int:
                return "each hold is [entry JSON, deadline ms]"
            try:
                entry = orjson.loads(item[0])
            except orjson.JSONDecodeError:
                return "each hold is [entry JSON, deadline ms]"
            if not valid_entry(entry):
                return "not a hold entry"
            mapping[item[0]] = item[1]
        if not mapping:
            return 0
        added = await self.store.client.zadd(HOLDS_KEY, mapping, nx=True)
        return int(added or 0)
