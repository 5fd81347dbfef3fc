"""The router's client of one shard: a NodeClient per endpoint of the shard.

A shard (a node id) may be served by several node processes, its endpoints, all on the
shard's one Redis. The router sends the shard's checks to one endpoint at a time, the
active one, so its batches stay full; when the active endpoint is marked down
(router/channel/watchdog.py, within the liveness bound) the next endpoint that is not
down becomes active. Control calls go to the active endpoint, then to the others in
turn; a topology push goes to every endpoint (`each`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from cluster.model.nodes import NodeSpec
from cluster.wire import HEALTH_PATH
from router.channel.breaker import Breaker
from router.channel.node_client import NodeClient
from router.errors import NodeUnavailable, Reason

log = logging.getLogger("shardlimit.dispatch")

EndpointFactory = Callable[[NodeSpec, Callable[[], None]], NodeClient]


class ShardClient:
    """Same surface as a NodeClient (what the rest of the router uses), over the active
    endpoint; counters are summed over every endpoint."""

    def __init__(self, spec: NodeSpec, make_endpoint: EndpointFactory) -> None:
        self.spec = spec
        self.make_endpoint = make_endpoint
        self.endpoints = [self._endpoint(url) for url in spec.urls]
        self.active = self.endpoints[0]
        self.switches = 0  # times the active endpoint changed
        self.expired = 0  # ops the shard answered `expired` (counted by the cluster view)
        self._bind()

    def _endpoint(self, url: str) -> NodeClient:
        return self.make_endpoint(
            NodeSpec(self.spec.id, url, self.spec.weight), self._endpoint_state
        )

    def respec(self, spec: NodeSpec) -> list[NodeClient]:
        """Take the shard's new list of endpoints, keeping the client (and what it knows:
        up or down, batches in flight) of each endpoint still listed. Returns the clients
        of endpoints no longer listed, for the caller to close."""
        kept = {endpoint.spec.url: endpoint for endpoint in self.endpoints}
        self.spec = spec
        self.endpoints = [
            kept.pop(url) if url in kept else self._endpoint(url) for url in spec.urls
        ]
        if self.active not in self.endpoints:
            self.active = self.endpoints[0]
            self._endpoint_state()
            self._bind()
        return list(kept.values())

    def _bind(self) -> None:
        # The hot path calls the active endpoint's queue directly: no call of ours per op.
        self.submit = self.active.submit
        self.submit_group = self.active.submit_group

    def _endpoint_state(self) -> None:
        """An endpoint was marked down or came back: keep the active one if it is up,
        else take the first endpoint that is up."""
        if self.active.state == "up":
            return
        for endpoint in self.endpoints:
            if endpoint.state == "up":
                log.warning(
                    "node %s: checks now go to %s (%s is down)",
                    self.spec.id,
                    endpoint.spec.url,
                    self.active.spec.url,
                )
                self.active = endpoint
                self.switches += 1
                self._bind()
                # It may have been idle for long: one that hung meanwhile is found at once,
                # not after the checks sent to it timed out.
                endpoint.watchdog.check(f"node {self.spec.id}: {endpoint.spec.url} is silent")
                return

    def each(self) -> Iterator[NodeClient]:
        """Every endpoint, the active one first."""
        yield self.active
        for endpoint in self.endpoints:
            if endpoint is not self.active:
                yield endpoint

    @property
    def state(self) -> str:
        return self.active.state

    async def learn_liveness_ports(self) -> None:
        """The liveness port of each endpoint that has not named it yet, from its own
        /healthz (a batch's answer names it too): one that never carried a check must be
        probed when it becomes active."""
        for endpoint in self.endpoints:
            if endpoint.liveness.live_port is None and endpoint.state == "up":
                with contextlib.suppress(NodeUnavailable):
                    health = await endpoint.get(HEALTH_PATH, timeout_s=1.0)
                    endpoint.learn_liveness_port(health.get("live"))

    async def post(
        self, path: str, payload: Any, method: str = "POST", timeout_s: float | None = None
    ) -> Any:
        """A control call; raises NodeUnavailable (see `_first_reached`)."""
        return await self._first_reached(lambda e: e.post(path, payload, method, timeout_s))

    async def get(self, path: str, timeout_s: float | None = None) -> Any:
        """A control call; raises NodeUnavailable (see `_first_reached`)."""
        return await self._first_reached(lambda e: e.get(path, timeout_s))

    async def _first_reached(self, call: Callable[[NodeClient], Awaitable[Any]]) -> Any:
        """`call` on the active endpoint, or, when its connection is refused or reset, on
        the next endpoint that is up. A timeout or an answer is never tried again
        elsewhere: the call may be running there. After a timeout the endpoint's liveness
        is probed: one that hung is marked down, and the next call goes elsewhere."""
        endpoints = [endpoint for endpoint in self.each() if endpoint.state == "up"]
        *others, last = endpoints or [self.active]
        for endpoint in others:
            try:
                return await self._call(call, endpoint)
            except NodeUnavailable as exc:
                if not never_reached(exc):
                    raise
        return await self._call(call, last)

    @staticmethod
    async def _call(call: Callable[[NodeClient], Awaitable[Any]], endpoint: NodeClient) -> Any:
        try:
            return await call(endpoint)
        except NodeUnavailable as exc:
            if exc.reason is Reason.TIMEOUT:
                endpoint.watchdog.check(str(exc))
            raise

    async def close(self) -> None:
        for endpoint in self.endpoints:
            await endpoint.close()

    # The queue's settings and the counters read by /metrics, /v1/cluster and tests.

    @property
    def breaker(self) -> Breaker:
        return self.active.breaker

    @property
    def max_inflight(self) -> int:
        return self.active.max_inflight

    @max_inflight.setter
    def max_inflight(self, value: int) -> None:
        for endpoint in self.endpoints:
            endpoint.max_inflight = value

    @property
    def queue_max(self) -> int:
        return self.active.queue_max

    @queue_max.setter
    def queue_max(self, value: int) -> None:
        for endpoint in self.endpoints:
            endpoint.queue_max = value

    @property
    def inflight(self) -> int:
        return sum(endpoint.inflight for endpoint in self.endpoints)

    @property
    def queued(self) -> int:
        return sum(endpoint.queued for endpoint in self.endpoints)

    @property
    def requests(self) -> int:
        return sum(endpoint.requests for endpoint in self.endpoints)

    @property
    def ops(self) -> int:
        return sum(endpoint.ops for endpoint in self.endpoints)

    @property
    def overloaded(self) -> int:
        return sum(endpoint.overloaded for endpoint in self.endpoints)

    @property
    def failures(self) -> int:
        return sum(endpoint.failures for endpoint in self.endpoints)

    @property
    def timeouts(self) -> int:
        return sum(endpoint.timeouts for endpoint in self.endpoints)

    @property
    def last_error(self) -> str | None:
        return self.active.last_error

    @property
    def late_undos(self) -> int:
        return sum(endpoint.late_undos for endpoint in self.endpoints)

    @property
    def late_undo_failures(self) -> int:
        return sum(endpoint.late_undo_failures for endpoint in self.endpoints)

    def endpoint_states(self) -> list[dict[str, Any]]:
        """`[{"url", "state", "active"}]` for /v1/cluster, status and /ui."""
        return [
            {
                "url": endpoint.spec.url,
                "state": endpoint.state,
                "active": endpoint is self.active,
            }
            for endpoint in self.endpoints
        ]


def never_reached(error: NodeUnavailable) -> bool:
    """The call never reached the endpoint's process (refused, reset, unreachable)."""
    cause = error.__cause__
    return isinstance(cause, OSError) and not isinstance(cause, TimeoutError)


def unanswered(error: NodeUnavailable) -> bool:
    """The endpoint's process gave no answer: never reached, or silent until the call's
    timeout (hung, or cut off by a partition)."""
    return never_reached(error) or error.reason is Reason.TIMEOUT
