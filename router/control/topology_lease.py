"""The lease that serialises topology changes across routers, kept on the lock node
(router/control/topology_sync.py): one migration at a time in the whole cluster."""

from __future__ import annotations

import asyncio
import secrets
import time

from router.control.topology_sync import TopologySync
from router.errors import NodeUnavailable, ReshardError


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

    async def acquire_patiently(self) -> None:
        """A crashed holder's lease runs out after its TTL; wait that long at most."""
        deadline = time.monotonic() + 2 * self.ttl_ms / 1000
        while True:
            try:
                await self.act("acquire")
                return
            except ReshardError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)  # retry cadence while the old lease runs out

    async def renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.ttl_ms / 3000)  # renewal cadence
            await self.act("renew")
