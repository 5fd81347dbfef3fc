"""The router's one transport boundary to counter nodes.

Concurrent operations bound for the same node are coalesced into one HTTP
request per tick (or per `coalesce_max` ops). Every transport failure is
translated here into NodeUnavailable; a circuit breaker stops waiting on a dead
node and a background probe lets traffic back as soon as it answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from cluster.model import NodeSpec
from router.transport import HttpPool

log = logging.getLogger("shardlimit.dispatch")


class NodeUnavailable(Exception):
    """The node did not answer usefully within the node timeout."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def _detail(raw: bytes) -> str:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw[:200].decode(errors="replace")
    return str(body.get("detail", body)) if isinstance(body, dict) else str(body)[:200]


class Breaker:
    """Opens after consecutive failures; closed again by a successful probe.

    A refused connection or a 503 (node up, its Redis down) is proof the node
    cannot answer: `threshold` of them in a row open the breaker. A timeout may
    only mean this machine stalled for a moment, so it takes `timeout_threshold`
    in a row, and the requests that were in flight together count once: only a
    timeout of a request sent after the previous counted timeout counts. A hung
    node still trips it after about `timeout_threshold` node timeouts.
    """

    def __init__(self, threshold: int = 3, timeout_threshold: int = 5) -> None:
        self.threshold = threshold
        self.timeout_threshold = timeout_threshold
        self.failures = 0
        self.timeouts = 0
        self.last_timeout_at = float("-inf")
        self.open_since: float | None = None

    @property
    def is_open(self) -> bool:
        return self.open_since is not None

    def success(self) -> None:
        self.failures = 0
        self.timeouts = 0
        self.open_since = None

    def failure(self, *, timed_out: bool = False, sent_at: float | None = None) -> bool:
        """Record a failure; True if this one opened the breaker."""
        if timed_out:
            if sent_at is not None and sent_at < self.last_timeout_at:
                return False  # in flight during a stall already counted
            self.timeouts += 1
            self.last_timeout_at = time.monotonic()
        else:
            self.failures += 1
        tripped = self.failures >= self.threshold or self.timeouts >= self.timeout_threshold
        if self.open_since is None and tripped:
            self.open_since = time.monotonic()
            return True
        return False


class NodeChannel:
    def __init__(
        self,
        spec: NodeSpec,
        token: str | None,
        *,
        timeout_s: float,
        coalesce_max: int,
        coalesce_wait_s: float,
        probe_interval_s: float = 0.1,
        per_op_s: float = 0.0002,
        on_epoch: Callable[[str, int], None] | None = None,
    ) -> None:
        self.spec = spec
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.pool = HttpPool(spec.url, headers)
        self.timeout_s = timeout_s
        self.coalesce_max = coalesce_max
        self.coalesce_wait_s = coalesce_wait_s
        self.probe_interval_s = probe_interval_s
        self.per_op_s = per_op_s
        self.on_epoch = on_epoch
        self.breaker = Breaker()
        self._pending: list[tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]] = []
        self._flush_handle: asyncio.Handle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._probe: asyncio.Task[None] | None = None
        self.requests = 0
        self.ops = 0
        self.failures = 0
        self.last_error: str | None = None

    @property
    def state(self) -> str:
        return "down" if self.breaker.is_open else "up"

    def submit(self, op: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        if self.breaker.is_open:
            future.set_exception(NodeUnavailable(f"node {self.spec.id} is down (circuit open)"))
            return future
        self._pending.append((op, future))
        if len(self._pending) >= self.coalesce_max:
            self._flush()
        elif self._flush_handle is None:
            if self.coalesce_wait_s > 0:
                self._flush_handle = loop.call_later(self.coalesce_wait_s, self._flush)
            else:
                self._flush_handle = loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        while self._pending:
            batch = self._pending[: self.coalesce_max]
            del self._pending[: self.coalesce_max]
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(
        self, batch: list[tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]]
    ) -> None:
        ops = [op for op, _ in batch]
        sent_at = time.monotonic()
        self.requests += 1
        self.ops += len(ops)
        try:
            # A node needs longer for a larger coalesced batch; one check keeps the
            # plain node timeout as its bound.
            allowance = self.timeout_s + self.per_op_s * (len(ops) - 1)
            body = await self.post("/node/v1/batch", {"ops": ops}, timeout_s=allowance)
            results = body["results"]
            if len(results) != len(batch):
                raise NodeUnavailable("node answered with a different number of results")
        except NodeUnavailable as exc:
            self._failed(str(exc), timed_out=exc.timed_out, sent_at=sent_at)
            for _, future in batch:
                if not future.done():
                    future.set_exception(NodeUnavailable(str(exc)))
            return
        self.breaker.success()
        if self.on_epoch is not None:
            self.on_epoch(self.spec.id, int(body.get("epoch", 0)))
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)

    async def post(
        self, path: str, payload: Any, method: str = "POST", timeout_s: float | None = None
    ) -> Any:
        return await self._request(method, path, orjson.dumps(payload), timeout_s)

    async def get(self, path: str, timeout_s: float | None = None) -> Any:
        return await self._request("GET", path, None, timeout_s)

    async def _request(
        self, method: str, path: str, data: bytes | None, timeout_s: float | None
    ) -> Any:
        """One request to the node; every failure becomes NodeUnavailable."""
        try:
            status, raw = await self.pool.request(method, path, data, timeout_s or self.timeout_s)
            if status != 200:
                raise NodeUnavailable(f"node {self.spec.id} answered {status}: {_detail(raw)}")
            return orjson.loads(raw)
        except TimeoutError as exc:
            raise NodeUnavailable(f"node {self.spec.id}: timed out", timed_out=True) from exc
        except (orjson.JSONDecodeError, OSError, ValueError) as exc:
            raise NodeUnavailable(f"node {self.spec.id}: {type(exc).__name__} {exc}") from exc

    def _failed(self, reason: str, *, timed_out: bool, sent_at: float | None = None) -> None:
        self.failures += 1
        self.last_error = reason
        if self.breaker.failure(timed_out=timed_out, sent_at=sent_at):
            log.warning("node %s marked down: %s", self.spec.id, reason)
            self._probe = asyncio.get_running_loop().create_task(self._probe_until_up())

    async def _probe_until_up(self) -> None:
        while self.breaker.is_open:
            await asyncio.sleep(self.probe_interval_s)  # probe cadence, not a wait for a condition
            try:
                await self.get("/readyz", timeout_s=max(0.25, self.timeout_s))
            except NodeUnavailable:
                continue
            log.warning("node %s is back", self.spec.id)
            self.breaker.success()

    async def close(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        for task in list(self._tasks):
            task.cancel()
        for _, future in self._pending:
            if not future.done():
                future.set_exception(NodeUnavailable("router shutting down"))
        self._pending.clear()
        self.pool.close()
