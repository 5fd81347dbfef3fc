"""When the router marks a node down, and how it finds it back up.

Slowness never marks a node down. A node is down when a connection to it is refused or
reset and a liveness probe gets no answer either, when it answers 503, or when it stays
silent while a batch is in flight and a liveness probe on a connection of its own gets no
answer. A down node is probed for readiness in the background until it answers again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from cluster.wire import READY_PATH
from router.channel.background import Background, cancel
from router.channel.breaker import Breaker
from router.channel.control_client import HttpPool
from router.channel.liveness import PROBE_TIMEOUT_S, RTT_FACTOR, LivenessProbe

log = logging.getLogger("shardlimit.dispatch")

# With a batch in flight and nothing heard from the node for PROBE_AFTER_S (stretched
# to a few times the slowest recent round trip), probe it. An idle-to-moderately loaded
# node that hangs is declared down about WATCH_TICK_S + PROBE_AFTER_S + PROBE_TIMEOUT_S
# (~300 ms) after it stopped answering.
WATCH_TICK_S = 0.025
PROBE_AFTER_S = 0.075
RECOVERY_PROBE_S = 0.1  # cadence of readiness probes while a node is down


class Watchdog:
    """Trips the node's breaker on proof that it cannot answer, and closes it again once
    the node is ready. `on_down` fails what the node's queue holds (never sent); `on_up`
    is told when a node marked down answers again."""

    def __init__(
        self,
        node_id: str,
        breaker: Breaker,
        liveness: LivenessProbe,
        pool: HttpPool,
        background: Background,
        on_down: Callable[[], None],
        on_up: Callable[[], None] | None = None,
    ) -> None:
        self.node_id = node_id
        self.breaker = breaker
        self.liveness = liveness
        self.pool = pool
        self.background = background
        self.on_down = on_down
        self.on_up = on_up
        self._recovery: asyncio.Task[None] | None = None

    def mark_down(self, reason: str) -> None:
        if not self.breaker.trip():
            return
        log.warning("node %s marked down: %s", self.node_id, reason)
        self.on_down()
        if self._recovery is None or self._recovery.done():
            self._recovery = asyncio.get_running_loop().create_task(self._recover())

    def check(self, reason: str) -> None:
        """After a refused or reset connection: down unless a fresh probe answers."""

        async def probe() -> None:
            if not await self.liveness.probe():
                self.mark_down(reason)

        self.background.spawn(probe())

    async def watch(self, sent_at: dict[int, float]) -> None:
        """While batches are in flight (`sent_at`: loop time each was sent): a node silent
        for too long is probed."""
        loop = asyncio.get_running_loop()
        liveness = self.liveness
        while sent_at and not self.breaker.is_open:
            await asyncio.sleep(WATCH_TICK_S)  # watch cadence, not a wait for a condition
            if not sent_at:
                return
            waiting_since = max(liveness.last_heard, min(sent_at.values()))
            if loop.time() - waiting_since < max(PROBE_AFTER_S, RTT_FACTOR * liveness.rtt_peak):
                continue
            if not await liveness.probe():
                self.mark_down(f"node {self.node_id}: no answer to a liveness probe")

    async def _recover(self) -> None:
        """While down: probe readiness (node and its Redis) until it answers."""
        while self.breaker.is_open:
            await asyncio.sleep(RECOVERY_PROBE_S)  # probe cadence
            try:
                status, _ = await self.pool.request(
                    "GET", READY_PATH, None, max(0.25, PROBE_TIMEOUT_S), fresh=True
                )
            except (OSError, TimeoutError):
                continue
            if status == 200:
                log.warning("node %s is back", self.node_id)
                self.liveness.heard()
                self.breaker.success()
                if self.on_up is not None:
                    self.on_up()

    async def close(self) -> None:
        await cancel(self._recovery)
