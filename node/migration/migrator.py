"""Moving Redis keys between nodes: export (DUMP), import (RESTORE once), background copy.

See docs/resharding.md for the protocol and why each step is safe to repeat.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import redis.asyncio as aioredis

from cluster import wire
from cluster.model.keys import marker_index_key, marker_key
from node.errors import PeerError
from node.migration.copy_step import MOVE_CHUNK, Budget, Finder, copy_step
from node.migration.direct import LANDED_GROUP, DirectMover
from node.migration.durable import held
from node.migration.entries import ExportEntry, decode_entries, encode_entries, entries_of
from node.migration.peer_client import Endpoints, PeerClient
from node.migration.peer_redis import PeerRedis
from node.migration.redis_time import RedisTime
from node.migration.source_reads import SourceReads
from node.store.redispy_pipe import own_sender, replies_or_raise, run_script
from node.store.scripts import read_lua
from node.topology.ownership import Ownership

log = logging.getLogger("shardlimit.node")
MARKER_TTL_MS = 2 * 86_400_000
MARKER_DROP = 500  # markers taken from a migration's index and dropped per call
# Guards one move of a copy step: raises PeerError once the topology changed, and holds
# back the next topology's acknowledgement while the move runs.
MoveGuard = Callable[[], AbstractAsyncContextManager[None]]


class Migrator:
    """Moves this node's keys during a migration: `client` is its counters' Redis,
    `peers` the other nodes."""

    def __init__(self, client: aioredis.Redis, peers: PeerClient) -> None:
        self.client = client
        self.peers = peers
        self.import_script = client.register_script(read_lua("import.lua"))
        self.revert_script = client.register_script(read_lua("import_revert.lua"))
        self._finder: tuple[tuple[str, int], Finder] | None = None
        self._budget: tuple[str, Budget] | None = None
        # One copy step at a time: a step the router stopped waiting for runs to its end
        # before the next one begins, from the cursor it answered.
        self._stepping = asyncio.Lock()
        # (migration id, run_id of this node's Redis, cursor) of the last copy step that
        # succeeded: a SCAN cursor means nothing to another Redis process.
        self._scanned_on: tuple[str, str, int] | None = None
        self.peer_redis = PeerRedis(peers)
        # The migration's own connection to this Redis, apart from the check path's: the
        # copy's reads and deletions, its pacing's readings, first touches' marker lookups
        # and imports.
        self.sender = own_sender(client)
        # Moves keys straight into the targets' Redis.
        self.direct = DirectMover(peers, self.peer_redis, self.sender)
        self.sources = SourceReads(peers, self.peer_redis)  # first touch from sources' Redis

    async def export(self, keys: Sequence[str], reverted: str | None = None) -> list[ExportEntry]:
        """DUMP + absolute expiry of each key (None when absent). Does not delete.

        `reverted`: the migration an abort undoes. A key is then authoritative only if
        this node holds it or imported it in that migration (its marker): otherwise it
        never came here, and the receiver's own copy is the current one."""
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        for key in keys:
            pipe.dump(key)
            pipe.pttl(key)
            if reverted is not None:
                pipe.exists(marker_key(reverted, key))
        return entries_of(keys, await pipe.execute(), reverted=reverted is not None)

    async def import_entries(
        self, migration_id: str, entries: Sequence[ExportEntry], *, replace: bool = False
    ) -> int:
        """Install keys once per migration (their markers). `replace`: an abort hands
        keys back, over the frozen copy the aborted migration left here."""
        if not entries:
            return 0
        keys: list[str] = [marker_index_key(migration_id)]
        args: list[Any] = [MARKER_TTL_MS]
        for key, dump, expiry, authoritative in entries:
            keys += [key, marker_key(migration_id, key)]
            args += [dump if dump is not None else b"", expiry]
            if replace:
                args.append(1 if authoritative else 0)
        script = self.revert_script if replace else self.import_script
        return int(await run_script(self.sender, script, keys, args))

    async def missing_markers(
        self, migration_id: str, keys: Sequence[str], *, reverting: bool = False
    ) -> list[str]:
        """The keys still to import: no marker, and absent here. A moving key present
        here without a marker came by the background copy (this node writes
        a moving key only after importing it, and a finished migration leaves no copy
        on a node that lost the key), so it is already the current one: no pull.
        Not when an abort hands keys back (`reverting`): a key present here may be the
        frozen copy the aborted migration left, so only the marker counts."""
        lookups = [
            ("EXISTS", marker_key(migration_id, key))
            if reverting
            else ("EXISTS", marker_key(migration_id, key), key)
            for key in keys
        ]
        found = replies_or_raise(await self.sender.execute(lookups))
        return [key for key, present in zip(keys, found, strict=True) if not present]

    async def pull(self, ownership: Ownership, source: Endpoints, keys: Sequence[str]) -> int:
        """Import `keys` from their previous owner unless already imported: through its
        export endpoint, or from its Redis once that answered in this migration
        (node/migration/source_reads.py)."""
        migration_id = ownership.migration_id
        assert migration_id is not None
        reverting = ownership.reverts is not None
        missing = await self.missing_markers(migration_id, keys, reverting=reverting)
        if not missing:
            return 0
        entries = None if reverting else await self.sources.read(source, migration_id, missing)
        if entries is None:
            payload = {"keys": missing, "topology": ownership.topology.to_dict()}
            body = await self.peers.post(source, wire.EXPORT_PATH, payload, timeout_s=5.0)
            entries = decode_entries(body["entries"])
            if not reverting:
                self.sources.exported(source, migration_id)
        return await self.import_entries(migration_id, entries, replace=reverting)

    def budget(self, migration_id: str, rate: int, busy_pct: int) -> Budget:
        """The pacing of this source's copy: kept across the steps of a migration, so
        a keys/s rate holds over the whole copy."""
        if self._budget is None or self._budget[0] != migration_id:
            redis_time = RedisTime(self.sender)
            self._budget = (migration_id, Budget(busy_pct, rate, redis_time=redis_time))
        budget = self._budget[1]
        budget.busy_pct, budget.rate = busy_pct, rate
        return budget

    async def copy_batch(
        self,
        ownership: Ownership,
        cursor: int,
        count: int,
        budget: Budget | None = None,
        guard: MoveGuard | None = None,
        *,
        replicated: bool = False,
    ) -> dict[str, Any]:
        """One copy step (node/migration/copy_step.py): examine up to `count` keys from
        `cursor`, send those that moved away to their new owners, then drop them here.
        Each move runs under `guard`. When an abort hands keys back, they go through the import
        endpoint (never a plain RESTORE, which cannot replace the target's stale copy).

        A SCAN cursor is good only for the Redis process that made it: the copy starts
        over from 0 unless `cursor` is what the last step that succeeded here answered,
        with this same process (a failover or a restart makes another), and a step
        during which it changed fails. `replicated` (this node's shard has replicas):
        a step answers only once a replica holds its deletions, so that a failover
        cannot bring back keys handed over."""
        async with self._stepping:
            return await self._copy_batch(ownership, cursor, count, budget, guard, replicated)

    async def _copy_batch(
        self,
        ownership: Ownership,
        cursor: int,
        count: int,
        budget: Budget | None,
        guard: MoveGuard | None,
        replicated: bool,
    ) -> dict[str, Any]:
        migration_id = ownership.migration_id
        if migration_id is None:
            return {"cursor": 0, "scanned": 0, "moved": 0, "restored": 0}
        server = await self._server()
        if cursor and self._scanned_on != (migration_id, server, cursor):
            log.warning(
                "copy of %s starts over: cursor %d is not this Redis'", migration_id, cursor
            )
            cursor = 0
        cached = (migration_id, ownership.epoch)
        if self._finder is None or self._finder[0] != cached:
            self._finder = (cached, Finder(self.client, ownership, self.sender))
        finder = self._finder[1]

        async def move_now(target: str, keys: list[str]) -> int:
            spec = ownership.node_spec(target)
            if spec is None:
                raise PeerError(f"target {target} is not in the topology")
            if ownership.reverts is not None:
                return await self._send_dumps(spec.urls, migration_id, keys)
            left = await self.direct.move(spec.urls, keys)
            return await self._send_dumps(spec.urls, migration_id, left) if left else 0

        async def move(target: str, keys: list[str]) -> int:
            if guard is None:
                return await move_now(target, keys)
            async with guard():
                return await move_now(target, keys)

        def chunk(target: str) -> int:
            spec = ownership.node_spec(target)
            durable = spec is None or self.peers.replicated.get(spec.urls, True)
            return LANDED_GROUP if durable and ownership.reverts is None else MOVE_CHUNK

        step = await copy_step(finder, move, cursor, count, budget or Budget(), chunk=chunk)
        if await self._server() != server:
            raise PeerError("this node's Redis changed during the copy step: it starts over")
        if replicated and step["moved"] and not await self.replica_holds_writes():
            raise PeerError("no replica of this node's Redis acknowledged the step's deletions")
        self._scanned_on = (migration_id, server, int(step["cursor"]))
        return step

    async def _server(self) -> str:
        """The run_id of this node's Redis process (new after a failover or a restart)."""
        info = await self.client.info("server")
        return str(info.get("run_id", ""))

    async def landed(
        self, keys: Sequence[str], replicated: bool, needed: int = 1
    ) -> tuple[list[str], int]:
        """At a target: which of `keys` (copied here) this node's Redis lacks, and how
        many replicas (of the `needed` waited for) hold the others (-1: the shard has
        none)."""
        return await held(self.client, keys, replicated, needed=needed)

    async def replica_holds_writes(self, needed: int = 1) -> bool:
        """`needed` replicas hold every write this node's Redis applied so far (a
        barrier)."""
        return (await held(self.client, [], True, needed=needed))[1] >= needed

    async def close(self) -> None:
        await self.sender.close()
        await self.sources.close()
        await self.peer_redis.close()

    async def _send_dumps(self, target: Endpoints, migration_id: str, keys: list[str]) -> int:
        entries = await self.export(keys)
        answer = await self.peers.post(
            target,
            wire.IMPORT_PATH,
            {"migration": migration_id, "entries": encode_entries(entries)},
            timeout_s=30.0,
        )
        # Only now, with the target's acknowledgement, drop our frozen copy.
        await self.client.delete(*keys)
        return int(answer.get("restored", 0))

    async def drop_markers(self, migration_id: str) -> int:
        """After a migration: its import markers are no longer consulted. The import
        scripts list them in the migration's marker index, so dropping them costs what
        the migration imported, not a scan of every key. (Markers of a node version
        without the index are left to their expiry.)"""
        index = marker_index_key(migration_id)
        dropped = 0
        while True:
            (markers,) = replies_or_raise(await self.sender.execute([("SPOP", index, MARKER_DROP)]))
            if not markers:
                return dropped
            (unlinked,) = replies_or_raise(await self.sender.execute([("UNLINK", *markers)]))
            dropped += int(unlinked)
