"""The lease that serialises topology changes across routers, kept on the lock node
(router/control/topology_sync.py): one migration at a time in the whole cluster."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Coroutine
from typing import Any

from router.control.topology_sync import TopologySync
from router.errors import NodeUnavailable, ReshardError

LEASE_MARGIN_S = 1.0  # past a lease's TTL, before it is taken for kept by its holder


class TopologyLease:
    """This router's hold of the "topology" lease; a crashed holder blocks the next
    one at most one TTL."""

    def __init__(self, sync: TopologySync, ttl_ms: int) -> None:
        self.sync = sync
        self.ttl_ms = ttl_ms
        self.token = secrets.token_hex(16)

    async def act(self, action: str) -> None:
        """Acquire, renew or release it; raises ReshardError if not held afterwards (or
        the lock node did not answer)."""
        try:
            held = await self.sync.lease("topology", action, self.token, self.ttl_ms)
        except NodeUnavailable as exc:
            raise ReshardError(
                f"the topology lease could not be taken ({action}): the lock node "
                f"{self.sync.lock_node()} did not answer: {exc}",
                "lock-node-unavailable",
                unavailable=True,
            ) from exc
        if not held and action != "release":
            raise ReshardError("another topology change holds the lease")

    async def acquire_patiently(self, patience_s: float | None = None) -> None:
        """A crashed holder's lease runs out after its TTL: wait for it, `patience_s` at
        most (by default twice the TTL)."""
        wait_s = 2 * self.ttl_ms / 1000 if patience_s is None else patience_s
        deadline = time.monotonic() + wait_s
        while True:
            try:
                await self.act("acquire")
                return
            except ReshardError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)  # retry cadence while the old lease runs out

    async def take_over(self) -> None:
        """Take the lease for a migration another router may have left: waiting out a
        gone router's lease (one TTL at most); ReshardError while one keeps renewing it."""
        try:
            await self.acquire_patiently(self.ttl_ms / 1000 + LEASE_MARGIN_S)
        except ReshardError as exc:
            if exc.unavailable:
                raise
            raise ReshardError(
                "another router holds the topology lease and keeps it: the migration runs "
                "there (its GET /v1/cluster says how far)"
            ) from None

    async def renew_forever(self) -> None:
        """Renew it every third of its TTL until cancelled. A lock node that does not
        answer is asked again while the lease may still be held; ReshardError once it is
        lost (another holds it, or it may have run out unrenewed)."""
        cadence_s = self.ttl_ms / 3000
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(cadence_s)  # renewal cadence
            try:
                await self.act("renew")
                renewed = time.monotonic()
            except ReshardError as exc:
                if not exc.unavailable or time.monotonic() - renewed + cadence_s >= 3 * cadence_s:
                    raise

    async def run_holding(self, work: Coroutine[Any, Any, None]) -> None:
        """`work` while the lease is renewed; stopped where it is (as if this router had
        died) once the lease is lost, since another router may then start a change of
        its own: ReshardError."""
        loop = asyncio.get_running_loop()
        renew = loop.create_task(self.renew_forever())
        working = loop.create_task(work)
        try:
            await asyncio.wait({renew, working}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (renew, working):
                if not task.done():
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError, ReshardError):
                    await task
        if not working.cancelled():
            working.result()  # raises what stopped it
            return
        renew.result()  # the lease is lost: raises ReshardError
