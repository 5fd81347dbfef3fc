"""The router's client of one counter node: the surface the rest of the router uses.

It puts together the pieces of this room, one job each:
- the channel (router/channel/link.py), one long-lived binary connection for batches;
- the node's queue and batcher (node_queue.py), the hot path;
- the reading of each batch's outcome (outcomes.py), where every transport failure
  becomes NodeUnavailable;
- the breaker (breaker.py), the liveness probe (liveness.py) and the watchdog that
  marks the node down and finds it back up (watchdog.py);
- the take-back of what late answers consumed (late_undo.py);
- control calls (node_control.py) over the one HTTP/1.1 client (control_client.py).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any

from cluster import wire
from cluster.model.nodes import NodeSpec
from router.channel.background import Background
from router.channel.breaker import Breaker, down
from router.channel.control_client import HttpPool
from router.channel.late_undo import LateUndo
from router.channel.link import NodeLink
from router.channel.liveness import LivenessProbe
from router.channel.node_control import NodeControl
from router.channel.node_queue import NodeQueue
from router.channel.outcomes import BatchOutcomes
from router.channel.watchdog import Watchdog


class NodeClient:
    def __init__(
        self,
        spec: NodeSpec,
        token: str | None,
        *,
        deadline_s: float,
        margin_s: float,
        max_inflight: int,
        queue_max: int,
        coalesce_max: int,
        coalesce_wait_s: float = 0.0,
        on_epoch: Callable[[str, int], None] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        on_state: Callable[[], None] | None = None,
    ) -> None:
        """`on_state` is told when the node is marked down and when it is back."""
        self.spec = spec
        self.on_state = on_state
        headers = {"Content-Type": wire.CONTENT_TYPE}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        # For https:// nodes: the router's client context (cluster/web/tls.py).
        self.ssl_context = ssl_context
        self.pool = HttpPool(spec.url, headers, ssl_context=ssl_context)
        self.breaker = Breaker()
        self.background = Background()
        self.liveness = LivenessProbe(spec.url, self.pool, ssl_context)
        self.control = NodeControl(spec.id, self.pool, self.liveness, deadline_s + margin_s)
        self.watchdog = Watchdog(
            spec.id,
            self.breaker,
            self.liveness,
            self.pool,
            self.background,
            self._queue_down,
            on_state,
        )
        self.outcomes = BatchOutcomes(spec.id, self.breaker, self.liveness, self.watchdog)
        self.late_undo = LateUndo(spec.id, self._resubmit, self.background)
        self.link = NodeLink(
            spec.url,
            token,
            self.control.channel_port,
            ssl_context=ssl_context,
            connect_timeout_s=deadline_s + margin_s,
        )
        self.queue = NodeQueue(
            spec.id,
            self.link,
            self.breaker,
            deadline_s=deadline_s,
            margin_s=margin_s,
            max_inflight=max_inflight,
            queue_max=queue_max,
            coalesce_max=coalesce_max,
            coalesce_wait_s=coalesce_wait_s,
            read_outcome=self.outcomes.read,
            watch=self.watchdog.watch,
            on_late=self.late_undo.late_reply,
            on_epoch=on_epoch,
        )
        # The hot path, as the queue's own bound methods: no call of the client's per op.
        self.submit = self.queue.submit
        self.submit_group = self.queue.submit_group
        self.expired = 0  # ops the node answered `expired` (counted by the cluster view)

    def _queue_down(self) -> None:
        # Marked down: queued checks were never sent; they fail now, having consumed nothing.
        node_id = self.spec.id
        self.queue.fail_queued(lambda: down(node_id))
        if self.on_state is not None:
            self.on_state()

    def _resubmit(self, op: wire.Op) -> asyncio.Future[wire.Result]:
        return self.queue.submit(op)

    @property
    def state(self) -> str:
        return "down" if self.breaker.is_open else "up"

    def learn_liveness_port(self, port: Any) -> None:
        """The liveness port the node names in its stats (see router/channel/liveness.py)."""
        self.liveness.learn_port(port)

    async def post(
        self, path: str, payload: Any, method: str = "POST", timeout_s: float | None = None
    ) -> Any:
        """A control call; raises NodeUnavailable."""
        return await self.control.post(path, payload, method, timeout_s)

    async def get(self, path: str, timeout_s: float | None = None) -> Any:
        """A control call; raises NodeUnavailable."""
        return await self.control.get(path, timeout_s)

    async def close(self) -> None:
        self.queue.stop()
        await self.watchdog.close()
        await self.background.close()
        await self.queue.close()
        self.pool.close()
        self.link.close()
        self.liveness.close()

    # The queue's settings and the counters read by /metrics, /v1/cluster and tests.

    @property
    def max_inflight(self) -> int:
        return self.queue.max_inflight

    @max_inflight.setter
    def max_inflight(self, value: int) -> None:
        self.queue.max_inflight = value

    @property
    def queue_max(self) -> int:
        return self.queue.queue_max

    @queue_max.setter
    def queue_max(self, value: int) -> None:
        self.queue.queue_max = value

    @property
    def inflight(self) -> int:
        return self.queue.inflight

    @property
    def queued(self) -> int:
        return self.queue.queued

    @property
    def requests(self) -> int:
        return self.queue.requests

    @property
    def ops(self) -> int:
        return self.queue.ops

    @property
    def overloaded(self) -> int:
        return self.queue.overloaded

    @property
    def failures(self) -> int:
        return self.outcomes.failures

    @property
    def timeouts(self) -> int:
        return self.outcomes.timeouts

    @property
    def last_error(self) -> str | None:
        return self.outcomes.last_error

    @property
    def late_undos(self) -> int:
        return self.late_undo.undone

    @property
    def late_undo_failures(self) -> int:
        return self.late_undo.failures
