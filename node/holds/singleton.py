"""Work that one endpoint of a shard does at a time (the holds sweeper), under a lease in
the shard's Redis: SET NX PX with a random owner token, renewed every third of its TTL,
deleted by its owner only (node/store/lua/lease.lua, as the routers' change leases).

The holder stops the work as soon as a renewal fails or takes longer than a third of the
TTL, so it stops before the lease can run out and another endpoint take it; a holder
that dies (SIGKILL) is replaced within about the TTL. What the work writes needs no more
than that: a hold's settle acts only on a decision still held (safe to repeat, so two
sweepers for an instant settle each hold once), and it is refused by the shard's epoch
fence when placed by an older topology (node/store/lua/common.lua).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable, Coroutine
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from node.store.scripts import read_lua

__all__ = ["SingletonLease"]

log = logging.getLogger("shardlimit.node")
TTL_MS = 1_000


class SingletonLease:
    """Runs `work` while this endpoint holds the lease `key`; `held` says whether it does."""

    def __init__(self, client: aioredis.Redis, key: str, ttl_ms: int = TTL_MS) -> None:
        self.client = client
        self.key = key
        self.ttl_ms = ttl_ms
        self.token = secrets.token_hex(16)  # this process: never reused by another
        self.held = False
        self.script = client.register_script(read_lua("lease.lua"))
        self._work: asyncio.Task[None] | None = None

    async def run(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Until cancelled: take or renew the lease every third of its TTL, with `work`
        running exactly while it is held."""
        every_s = self.ttl_ms / 3000
        try:
            while True:
                held = await self._renewed(every_s)
                if held and (self._work is None or self._work.done()):
                    self._log_start()
                    self._work = asyncio.get_running_loop().create_task(work())
                elif not held and self._work is not None:
                    log.info("this endpoint no longer holds the shard's %s lease", self.key)
                    await self._stop_work()
                self.held = held
                await asyncio.sleep(every_s)
        finally:
            await self._stop_work()  # the lease stays held until release(), or runs out

    def _log_start(self) -> None:
        ended = self._work
        if ended is None:
            log.info("this endpoint holds the shard's %s lease", self.key)
        elif not ended.cancelled() and ended.exception() is not None:
            log.error("the %s work failed; started again", self.key, exc_info=ended.exception())

    async def _renewed(self, within_s: float) -> bool:
        """Acquire (or renew, when held) the lease; False when not held, or not known to
        be within `within_s`."""
        # asyncio.timeout, not wait_for: 3.11's wait_for may swallow a cancellation that
        # comes as the reply does, and run() would then never end.
        try:
            async with asyncio.timeout(within_s):
                reply = await self.script(
                    keys=[self.key], args=["acquire", self.token, self.ttl_ms]
                )
        except (RedisError, OSError, TimeoutError) as exc:
            if self.held:
                log.warning("the shard's %s lease could not be renewed: %s", self.key, exc)
            else:
                log.warning(
                    "the shard's %s lease could not be taken, will retry: %s", self.key, exc
                )
            return False
        return bool(reply == 1)

    async def _stop_work(self) -> None:
        work, self._work = self._work, None
        if work is not None:
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work

    async def release(self) -> None:
        """Give the lease up at once (a clean shutdown): another endpoint takes it at its
        next try rather than after the TTL. Sent even when `held` is False: a renewal
        that answered late leaves the lease in Redis, ours (the script deletes it only for
        this token)."""
        self.held = False
        try:
            async with asyncio.timeout(self.ttl_ms / 1000):  # by then it ran out anyway
                await self.script(keys=[self.key], args=["release", self.token, self.ttl_ms])
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("the shard's %s lease was not released (it expires): %s", self.key, exc)
