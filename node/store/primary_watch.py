"""Following Sentinel's `+switch-master` as it is announced: the node listens on every
Sentinel of its URL and, once one announces a new primary for the node's master name,
points its Redis pools there. From then on no command goes to the old primary
(node/store/connect.py PrimaryConnection reconnects first), so a demoted primary that
comes back (a SIGCONT, a healed partition) serves nothing while Sentinel has yet to
turn it into a replica. Without the announcement the node would still find the new
primary, but only as its connections to the old one break.

A Sentinel that stops answering is retried; an announcement missed meanwhile is caught
by the ROLE check each new connection makes and by Redis' READONLY on a demoted primary.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

import redis.asyncio as aioredis
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import RedisError

from cluster.model.sentinel_url import SentinelUrl

__all__ = ["PrimaryWatch", "switch_of"]

log = logging.getLogger("shardlimit.node")

CHANNEL = "+switch-master"
RETRY_S = 0.5  # before listening again on a Sentinel that stopped answering
CONNECT_TIMEOUT_S = 0.25


def switch_of(message: bytes | str, master: str) -> tuple[str, int] | None:
    """The new primary's address when a +switch-master message (`<name> <old-ip>
    <old-port> <new-ip> <new-port>`) is about `master`, else None."""
    text = message.decode() if isinstance(message, bytes) else message
    parts = text.split()
    if len(parts) != 5 or parts[0] != master or not parts[4].isdigit():
        return None
    return parts[3], int(parts[4])


class PrimaryWatch:
    """One listener per Sentinel; `on_switch(address)` runs once per new primary."""

    def __init__(
        self,
        target: SentinelUrl,
        pools: Sequence[SentinelConnectionPool],
        on_switch: Callable[[tuple[str, int]], None],
    ) -> None:
        self.target = target
        self.pools = pools
        self.on_switch = on_switch
        self.tasks: list[asyncio.Task[None]] = []
        self.followed: tuple[str, int] | None = None  # the last primary announced

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.tasks = [loop.create_task(self._listen(*address)) for address in self.target.sentinels]

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.tasks = []

    async def follow(self, address: tuple[str, int]) -> None:
        """Point every pool at `address`; idle connections to another server close."""
        if address == self.followed:
            return  # another Sentinel's announcement of the same promotion
        self.followed = address
        for pool in self.pools:  # all named before any await: commands go there only
            pool.master_address = address
        log.warning("following the promoted primary %s:%d", *address)
        self.on_switch(address)
        for pool in self.pools:
            await pool.disconnect(inuse_connections=False)

    async def _listen(self, host: str, port: int) -> None:
        while True:
            client = aioredis.Redis(host=host, port=port, socket_connect_timeout=CONNECT_TIMEOUT_S)
            try:
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(CHANNEL)
                    async for message in pubsub.listen():
                        if message.get("type") != "message":
                            continue
                        address = switch_of(message["data"], self.target.master)
                        if address is not None:
                            await self.follow(address)
            except (RedisError, OSError) as exc:
                log.debug("Sentinel %s:%d: %s; listening again", host, port, exc)
            finally:
                await client.aclose()
            await asyncio.sleep(RETRY_S)
