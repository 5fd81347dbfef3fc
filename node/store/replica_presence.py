"""Whether a replica can acknowledge now, so that `durability: replica` checks do not
wait for one that is not there.

After a WAIT that no replica answered in time, the shard counts as having no live
replica: its durable checks are answered degraded (`unreplicated`) at once, without
running, and nothing else in their batches waits for a WAIT. Meanwhile the primary's
INFO replication is read every PROBE_S; once it lists a replica online that has
acknowledged the stream within LIVE_LAG_S, WAIT is tried again. Without this, each
batch would hold its in-flight slot for the whole WAIT timeout while the replicas are
down, and `durability: primary` checks of the same node would queue behind it.

While replicas answer, `needed` is how many WAIT asks for: every replica of the shard
that any Sentinel could promote (up, and its INFO read: node/store/connect.py
`promotable`; recounted each RECOUNT_S, and at once after a WAIT that fell short), at
least one. Waiting for one of two would let Sentinel promote the other,
which may lack the decision just acknowledged: Sentinel picks the replica with the
largest offset it last saw, not the one that answered WAIT. The count is Sentinel's,
not the primary's: a replica being promoted has left the primary but is still a
replica to the Sentinels until the failover ends, so meanwhile the old primary, which
only the other replicas still follow, acknowledges nothing.

Except a replica away from the stream: one whose link to the primary was down at the
Sentinels' freshest read of it (restarting, connecting), or that the primary lists as
still taking its dataset (a full sync: its state not yet `online`). It acknowledges
nothing until it is back, so a WAIT for it only times out, and every durable check of
the shard would answer degraded for as long as that takes, each time a replica
restarts. Not waiting for it loses nothing it could have held: once back, the sync
brings it every write made meanwhile, and what was acknowledged while it was away it
lacks whatever WAIT asks. With equal `replica-priority`, Sentinel promotes the replica
with the largest offset, which one away from the stream does not have.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from node.store.connect import host_port, sentinel_replicas

__all__ = ["ReplicaPresence", "listed_replicas", "live_replicas", "needed_of", "syncing_replicas"]

log = logging.getLogger("shardlimit.node")

PROBE_S = 0.1
RECOUNT_S = 1.0
LIVE_LAG_S = 1  # Redis reports the lag in whole seconds; replicas acknowledge each second


def listed_replicas(info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """ "host:port" -> its entry (state, offset, lag) of each replica INFO replication
    lists: those connected to the primary."""
    return {
        host_port(value["ip"], value["port"]): value
        for name, value in info.items()
        if name.startswith("slave") and isinstance(value, dict) and "ip" in value
    }


def live_replicas(info: dict[str, Any]) -> int:
    """Replicas INFO replication lists as online and acknowledging."""
    return sum(
        1
        for value in listed_replicas(info).values()
        if value.get("state") == "online" and int(value.get("lag", 0)) <= LIVE_LAG_S
    )


def syncing_replicas(info: dict[str, Any]) -> set[str]:
    """The replicas INFO replication lists as still taking the dataset."""
    return {a for a, value in listed_replicas(info).items() if value.get("state") != "online"}


def needed_of(known: dict[str, bool], info: dict[str, Any]) -> int:
    """How many replicas a WAIT asks for: those the Sentinels' view waits for
    (node/store/connect.py `sentinel_replicas`) less those the primary's INFO
    replication `info` lists as taking the dataset, at least one."""
    syncing = syncing_replicas(info)
    return max(1, sum(waited and a not in syncing for a, waited in known.items()))


class ReplicaPresence:
    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self.absent = False  # read on the hot path: a plain attribute
        self.needed = 1  # replicas each WAIT asks for; read on the hot path
        self._probe: asyncio.Task[None] | None = None
        self._recounter: asyncio.Task[None] | None = None
        self._recount_now = asyncio.Event()

    def start(self) -> None:
        self._recounter = asyncio.get_running_loop().create_task(self._recount_forever())

    def fell_short(self, acked: int) -> None:
        """A WAIT was acknowledged by `acked` replicas, fewer than `needed`."""
        if acked <= 0:
            self.missed()
        else:
            self._recount_now.set()

    async def _recount_forever(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._recount_now.wait(), RECOUNT_S)
            self._recount_now.clear()
            known = await sentinel_replicas(self.client)
            if known is not None:
                try:
                    info = await self.client.info("replication")
                except (RedisError, OSError):  # every check of the shard waits on it anyway
                    info = {}
                self.needed = needed_of(known, info)

    def missed(self, why: str = "no replica acknowledges") -> None:
        """No replica acknowledged a WAIT in time (or none can yet: `why`)."""
        if self.absent:
            return
        self.absent = True
        log.warning("%s: durability replica checks answer degraded", why)
        self._probe = asyncio.get_running_loop().create_task(self._until_back())

    def promoted(self) -> None:
        """The node follows a newly promoted primary. Its replicas follow it only once
        Sentinel has confirmed the promotion and resynced them: until then a WAIT would
        only time out, holding up the other checks of its batch past their deadline."""
        self._recount_now.set()
        self.missed("a replica was just promoted, and no replica follows it yet")

    async def _until_back(self) -> None:
        while True:
            await asyncio.sleep(PROBE_S)  # a period: Redis has no event to wait on
            try:
                info = await self.client.info("replication")
            except (RedisError, OSError):
                continue
            if live_replicas(info) > 0:
                self.absent = False
                log.warning("a replica acknowledges again: durability replica checks served")
                return

    async def close(self) -> None:
        for task in (self._probe, self._recounter):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
