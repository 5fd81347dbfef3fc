"""Following a failover as Sentinel runs it: the node listens on every Sentinel of its
URL and points its Redis pools at the new primary at the first of

- `+failover-state-wait-promotion`: the Sentinels' leader has sent the replica it chose
  REPLICAOF NO ONE. Sentinel confirms the promotion only at its next INFO of that
  replica (up to a second later) and until then names the old primary; the node does
  not wait for that (each connection still checks ROLE, so nothing is written to the
  replica before it is a primary). Unconfirmed within CONFIRM_S, the Sentinels' answer
  rules again.
- `+switch-master`: the promotion is done.

From then on no command goes to the old primary (node/store/connect.py
PrimaryConnection reconnects first), so a demoted primary that comes back (a SIGCONT, a
healed partition) serves nothing while Sentinel has yet to turn it into a replica.

A Sentinel that stops answering is retried; an announcement missed meanwhile is caught
by the ROLE check each new connection makes and by Redis' READONLY on a demoted primary.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from cluster.model.sentinel_url import SentinelUrl
from node.store.connect import FollowingPool

__all__ = ["PrimaryWatch", "promotion_of", "switch_of"]

log = logging.getLogger("shardlimit.node")

SWITCHED = "+switch-master"
PROMOTING = "+failover-state-wait-promotion"
CONFIRM_S = 10.0  # Sentinel's failover-timeout: a promotion not confirmed by then failed
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


def promotion_of(message: bytes | str, master: str) -> tuple[str, int] | None:
    """The replica being promoted when a +failover-state-wait-promotion message
    (`slave <name> <ip> <port> @ <master-name> <ip> <port>`) is about `master`."""
    text = message.decode() if isinstance(message, bytes) else message
    parts = text.split()
    if len(parts) != 8 or parts[0] != "slave" or parts[4] != "@" or parts[5] != master:
        return None
    return (parts[2], int(parts[3])) if parts[3].isdigit() else None


class PrimaryWatch:
    """One listener per Sentinel; `on_switch(address)` runs once per new primary."""

    def __init__(
        self,
        target: SentinelUrl,
        pools: Sequence[FollowingPool],
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

    async def _heard(self, channel: bytes, data: bytes) -> None:
        master = self.target.master
        if channel.decode() == SWITCHED:
            address = switch_of(data, master)
            if address is not None:
                for pool in self.pools:
                    pool.promoted = None  # Sentinel names it from now on
                    pool.switched(address)
                await self.follow(address)
            return
        address = promotion_of(data, master)
        if address is None:
            return
        for pool in self.pools:
            pool.promoted = address
        asyncio.get_running_loop().call_later(CONFIRM_S, self._unconfirmed, address)
        await self.follow(address)

    def _unconfirmed(self, address: tuple[str, int]) -> None:
        for pool in self.pools:
            if pool.promoted == address:
                pool.promoted = None
                log.warning("promotion of %s:%d not confirmed: asking the Sentinels", *address)

    async def _listen(self, host: str, port: int) -> None:
        while True:
            client = aioredis.Redis(host=host, port=port, socket_connect_timeout=CONNECT_TIMEOUT_S)
            try:
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(SWITCHED, PROMOTING)
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            await self._heard(message["channel"], message["data"])
            except (RedisError, OSError) as exc:
                log.debug("Sentinel %s:%d: %s; listening again", host, port, exc)
            finally:
                await client.aclose()
            await asyncio.sleep(RETRY_S)
