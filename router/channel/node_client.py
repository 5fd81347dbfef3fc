"""The router's one transport boundary to counter nodes.

Checks bound for the same node wait in one bounded queue and leave it as batches:
at most `max_inflight` batch requests are in flight per node, and checks arriving
meanwhile join the next batch, so under load batches grow instead of requests
multiplying (Gubernator's peer batching is the model). A full queue refuses at
once (`overloaded`).

Every batch carries a deadline (cluster/wire.py). The router waits for it until
the deadline plus a margin, and the node guarantees nothing was applied that it
did not answer in time, so a batch given up on consumed nothing.

Slowness never marks a node down. A node is down when a connection to it is
refused or reset, when it answers 503, or when it stays silent while a batch is in
flight and a liveness probe on a connection of its own gets no answer either. A
down node fails new checks at once (nothing sent, nothing consumed) and is probed
in the background until it answers again. Every transport failure is translated
here into NodeUnavailable.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from typing import Any
from urllib.parse import urlsplit

import msgspec
import orjson

from cluster import wire
from cluster.model.nodes import NodeSpec
from cluster.wire import HEALTH_PATH, READY_PATH
from router.channel.control_client import HttpPool
from router.channel.link import Done, NodeLink
from router.channel.op_group import OpGroup
from router.errors import NodeUnavailable, Reason

log = logging.getLogger("shardlimit.dispatch")

# Liveness: with a batch in flight and nothing heard from the node for PROBE_AFTER_S,
# probe it on a fresh connection; no answer within PROBE_TIMEOUT_S (and nothing else
# heard meanwhile) means it hangs. Both stretch to a few times the slowest recent batch
# round trip, so a node that is merely busy (or a router whose own loop is saturated)
# is never taken for a hung one. An idle-to-moderately loaded node that hangs is
# declared down about WATCH_TICK_S + PROBE_AFTER_S + PROBE_TIMEOUT_S (~300 ms) after
# it stopped answering.
WATCH_TICK_S = 0.025
PROBE_AFTER_S = 0.075
PROBE_TIMEOUT_S = 0.2
RTT_FACTOR = 3
OWN_STALL_S = 0.05  # a probe timeout handled this late reflects our own stall
RTT_DECAY = 0.9  # per batch: how fast the remembered slowest round trip fades
RECOVERY_PROBE_S = 0.1  # cadence of readiness probes while a node is down
LATE_UNDO_PATIENCE_S = 600.0  # how long a late check is offered back to its node
CIRCUIT_OPEN = "circuit open"


def _detail(raw: bytes) -> str:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw[:200].decode(errors="replace")
    return str(body.get("detail", body)) if isinstance(body, dict) else str(body)[:200]


class Breaker:
    """Up or down. Opened by proof that the node cannot answer; closed by any answer."""

    def __init__(self) -> None:
        self.open_since: float | None = None
        self.opened = 0  # times it opened

    @property
    def is_open(self) -> bool:
        return self.open_since is not None

    def success(self) -> None:
        self.open_since = None

    def trip(self) -> bool:
        """Open it; True if it was closed."""
        if self.open_since is not None:
            return False
        self.open_since = time.monotonic()
        self.opened += 1
        return True


# Queued ops, as runs: a run's outcomes go to one op's own future, or to an OpGroup's
# slots from `start` on (a group's run may leave in more than one batch). `layout`: the
# layout_id of the topology that placed the run's ops on this node (0: not placed by owner).
Sink = asyncio.Future[wire.Result] | OpGroup
Pending = tuple[list[wire.Op], Sink, int, int]


def _ignore(_value: float) -> None:
    pass


def _fail(runs: Iterable[Pending], error: Callable[[], NodeUnavailable]) -> None:
    """Every op of `runs` answered with an exception of its own."""
    for run, sink, start, _ in runs:
        if isinstance(sink, OpGroup):
            for index in range(start, start + len(run)):
                sink.settle(index, error())
        elif not sink.done():
            sink.set_exception(error())


class NodeChannel:
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
    ) -> None:
        self.spec = spec
        headers = {"Content-Type": wire.CONTENT_TYPE}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        # For https:// nodes: the router's client context (cluster/web/tls.py).
        self.ssl_context = ssl_context
        self.pool = HttpPool(spec.url, headers, ssl_context=ssl_context)
        # The hot path: batches as frames on one connection (router/channel/link.py).
        self.link = NodeLink(
            spec.url,
            token,
            self._discover,
            ssl_context=ssl_context,
            connect_timeout_s=deadline_s + margin_s,
        )
        self.deadline_s = deadline_s
        self.margin_s = margin_s
        self.max_inflight = max_inflight
        self.queue_max = queue_max
        self.coalesce_max = coalesce_max
        self.coalesce_wait_s = coalesce_wait_s
        self.on_epoch = on_epoch
        self.breaker = Breaker()
        self._pending: deque[Pending] = deque()
        self._queued = 0  # ops in `_pending`
        self._flush_handle: asyncio.Handle | None = None
        self._sent_at: dict[int, float] = {}  # in-flight batch id -> loop time sent
        self._batch_ids = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._watchdog: asyncio.Task[None] | None = None
        self._recovery: asyncio.Task[None] | None = None
        self._last_heard = 0.0
        self._rtt_peak = 0.0  # slowest recent batch round trip, decaying
        self._live_port: int | None = None
        self._live_pool: HttpPool | None = None
        # Counters for /metrics.
        self.requests = 0
        self.ops = 0
        self.failures = 0
        self.timeouts = 0
        self.expired = 0
        self.overloaded = 0
        self.late_undos = 0  # checks of late answers taken back
        self.late_undo_failures = 0
        self.last_error: str | None = None
        # Observers for /metrics (router/metrics.py): ops per batch, answered round trips.
        self.on_batch: Callable[[int], None] = _ignore
        self.on_round_trip: Callable[[float], None] = _ignore

    @property
    def state(self) -> str:
        return "down" if self.breaker.is_open else "up"

    @property
    def inflight(self) -> int:
        return len(self._sent_at)

    @property
    def queued(self) -> int:
        return self._queued

    def submit(self, op: wire.Op, layout: int = 0) -> asyncio.Future[wire.Result]:
        """Queue one op; `layout`: the layout_id of the topology that placed it on this
        node, if one did (its key's owner): the node need not place it again (wire.Request)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[wire.Result] = loop.create_future()
        if self.breaker.is_open:
            future.set_exception(
                NodeUnavailable(f"node {self.spec.id} is down ({CIRCUIT_OPEN})", Reason.DOWN)
            )
        elif self._queued >= self.queue_max:
            self.overloaded += 1
            future.set_exception(
                NodeUnavailable(
                    f"node {self.spec.id}: {self.queue_max} checks already queued",
                    Reason.OVERLOADED,
                )
            )
        else:
            self._pending.append(([op], future, 0, layout))
            self._queued += 1
            self._schedule()
        return future

    def submit_group(self, ops: list[wire.Op], layout: int = 0) -> OpGroup:
        """Queue `ops` as `submit` would each, their outcomes gathered in one OpGroup."""
        group = OpGroup(len(ops))
        if self.breaker.is_open:
            for index in range(len(ops)):
                group.settle(
                    index,
                    NodeUnavailable(f"node {self.spec.id} is down ({CIRCUIT_OPEN})", Reason.DOWN),
                )
            return group
        room = max(0, self.queue_max - self._queued)
        if room:
            self._pending.append((ops if room >= len(ops) else ops[:room], group, 0, layout))
            self._queued += min(room, len(ops))
        for index in range(room, len(ops)):
            self.overloaded += 1
            group.settle(
                index,
                NodeUnavailable(
                    f"node {self.spec.id}: {self.queue_max} checks already queued",
                    Reason.OVERLOADED,
                ),
            )
        self._schedule()
        return group

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """A background task of this channel: kept referenced, cancelled by close()."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _schedule(self) -> None:
        if self._flush_handle is not None or not self._pending:
            return
        if self.inflight >= self.max_inflight:
            return  # a finishing batch reschedules
        loop = asyncio.get_running_loop()
        if self.coalesce_wait_s > 0:
            self._flush_handle = loop.call_later(self.coalesce_wait_s, self._flush)
        else:
            self._flush_handle = loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        loop = asyncio.get_running_loop()
        while self._pending and self.inflight < self.max_inflight:
            batch = self._take(self.coalesce_max)
            self._batch_ids += 1
            batch_id = self._batch_ids
            self._sent_at[batch_id] = loop.time()
            self._send(batch_id, batch)
        if self._sent_at and (self._watchdog is None or self._watchdog.done()):
            self._watchdog = loop.create_task(self._watch())

    def _take(self, most: int) -> list[Pending]:
        """The queue's first `most` ops (runs, the last one perhaps split)."""
        pending = self._pending
        runs: list[Pending] = []
        while pending and most:
            ops, sink, start, layout = pending[0]
            if len(ops) <= most:
                runs.append(pending.popleft())
                most -= len(ops)
                self._queued -= len(ops)
            else:
                runs.append((ops[:most], sink, start, layout))
                pending[0] = (ops[most:], sink, start + most, layout)
                self._queued -= most
                most = 0
        return runs

    def _send(self, batch_id: int, batch: list[Pending]) -> None:
        """One batch onto the channel; its answer settles the checks' futures."""
        ops = batch[0][0] if len(batch) == 1 else [op for run, _, _, _ in batch for op in run]
        layout = batch[0][3]
        if any(run[3] != layout for run in batch):
            layout = 0  # placed by different layouts: the node places each op
        started = asyncio.get_running_loop().time()

        def done(outcome: wire.Reply | BaseException) -> None:
            try:
                results, epoch = self._outcome(ops, started, outcome)
            except NodeUnavailable as exc:
                _fail(batch, functools.partial(NodeUnavailable, str(exc), exc.reason))
            else:
                if self.on_epoch is not None:
                    self.on_epoch(self.spec.id, epoch)
                at = 0
                for run, sink, start, _ in batch:
                    if isinstance(sink, OpGroup):
                        sink.settle_run(start, results[at : at + len(run)])
                    elif not sink.done():
                        sink.set_result(results[at])
                    at += len(run)
            finally:
                del self._sent_at[batch_id]
                self._schedule()

        self._start_exchange(ops, done, layout)

    def _start_exchange(self, ops: list[wire.Op], done: Done, layout: int = 0) -> None:
        self.requests += 1
        self.ops += len(ops)
        self.on_batch(len(ops))
        deadline_ms = int(time.time() * 1000 + self.deadline_s * 1000)
        self.link.send(
            deadline_ms,
            ops,
            self.deadline_s + self.margin_s,
            done,
            on_late=functools.partial(self._late_reply, ops),
            layout=layout,
        )

    async def _exchange(self, ops: list[wire.Op]) -> tuple[list[wire.Result], int]:
        """One batch on the channel: (results in order, the node's epoch)."""
        answer: asyncio.Future[wire.Reply | BaseException] = (
            asyncio.get_running_loop().create_future()
        )
        started = asyncio.get_running_loop().time()
        self._start_exchange(ops, answer.set_result)
        return self._outcome(ops, started, await answer)

    def _outcome(
        self, ops: list[wire.Op], started: float, outcome: wire.Reply | BaseException
    ) -> tuple[list[wire.Result], int]:
        """A batch's results and the node's epoch, or NodeUnavailable saying why not."""
        if isinstance(outcome, TimeoutError):
            self.timeouts += 1
            self._note_failure(f"node {self.spec.id}: no answer by the deadline")
            raise NodeUnavailable(
                f"node {self.spec.id}: timed out (no answer by deadline + margin)", Reason.TIMEOUT
            ) from outcome
        if isinstance(outcome, OSError):
            reason = f"node {self.spec.id}: {type(outcome).__name__} {outcome}"
            self._note_failure(reason)
            self._check_liveness(reason)
            raise NodeUnavailable(reason) from outcome
        if isinstance(outcome, BaseException):
            raise outcome
        self._heard()
        self.on_round_trip(self._last_heard - started)
        self._rtt_peak = max(self._last_heard - started, self._rtt_peak * RTT_DECAY)
        if outcome.status == 503:
            reason = f"node {self.spec.id} answered 503: {outcome.detail}"
            self._note_failure(reason)
            self._mark_down(reason)
            raise NodeUnavailable(reason)
        reply = outcome.reply
        if outcome.status != 200 or reply is None or len(reply.results) != len(ops):
            if outcome.status != 200:
                reason = f"node {self.spec.id}: answered {outcome.status}: {outcome.detail}"
            else:
                reason = f"node {self.spec.id}: answered with a different number of results"
            self._note_failure(reason)
            raise NodeUnavailable(reason, Reason.ERROR)
        self.learn_liveness_port(reply.live)
        self.breaker.success()
        return reply.results, reply.epoch

    def _late_reply(self, ops: list[wire.Op], reply: wire.Reply) -> None:
        if reply.status == 200 and reply.reply is not None:
            self._take_back_consumed(ops, reply.reply)
        else:
            log.error("node %s: late answer %d: %s", self.spec.id, reply.status, reply.detail)

    def _late_answer(self, ops: list[wire.Op], status: int, raw: bytes) -> None:
        """A late answer as the HTTP batch endpoint gives it (see _take_back_consumed)."""
        try:
            reply = wire.decode_reply(raw) if status == 200 else None
        except (msgspec.ValidationError, msgspec.DecodeError):
            reply = None
        if reply is None:
            log.error("node %s: unreadable late answer (HTTP %d)", self.spec.id, status)
            return
        self._take_back_consumed(ops, reply)

    def _take_back_consumed(self, ops: list[wire.Op], reply: wire.BatchReply) -> None:
        """An answer to a batch we gave up on (so its checks were answered degraded)
        came after all: a node stopped between finishing it and answering. Whatever
        those checks consumed is taken back, so that a degraded answer consumed nothing.
        """
        if len(reply.results) != len(ops):
            log.error("node %s: late answer with a different number of results", self.spec.id)
            return
        for op, result in zip(ops, reply.results, strict=True):
            if isinstance(result, wire.Checked) and result.undo is not None:
                undo = msgspec.structs.replace(op, kind="undo", undo=result.undo)
                self._spawn(self._take_back(undo))

    async def _take_back(self, undo: wire.Op) -> None:
        """Send an undo op until the node takes it (it has just come back: it may still
        be marked down for a moment)."""
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + LATE_UNDO_PATIENCE_S
        while True:
            try:
                result = await self.submit(undo)
            except NodeUnavailable as exc:
                result, error = None, str(exc)
            else:
                error = f"answered {result!r}"
            if isinstance(result, wire.Undone):
                self.late_undos += 1
                return
            if loop.time() > give_up_at:
                # Not taken back: the one case where a degraded answer did consume.
                self.late_undo_failures += 1
                log.error("node %s: a late check could not be taken back: %s", self.spec.id, error)
                return
            await asyncio.sleep(RECOVERY_PROBE_S)  # retry cadence while the node is down

    async def _discover(self, timeout_s: float) -> int:
        """The node's channel port, from its /healthz (which names its liveness port too)."""
        status, raw = await self.pool.request("GET", HEALTH_PATH, None, timeout_s)
        try:
            health = orjson.loads(raw) if status == 200 else None
        except orjson.JSONDecodeError:
            health = None
        port = health.get("channel") if isinstance(health, dict) else None
        if not isinstance(port, int) or not 0 < port < 65536:
            raise ConnectionRefusedError(f"node {self.spec.id} names no channel port ({status})")
        self.learn_liveness_port(health.get("live") if isinstance(health, dict) else None)
        return port

    def learn_liveness_port(self, port: Any) -> None:
        """Nodes answer liveness probes on a port of their own (node/health/liveness.py),
        announced in each batch answer and in their stats; until known, probes go to
        the main port, where only a refusal counts (a busy event loop is no proof).
        It speaks what the main port speaks: TLS (same certificate) for an https node."""
        if not isinstance(port, int) or port == self._live_port or not 0 < port < 65536:
            return
        self._live_port = port
        url = urlsplit(self.spec.url)
        self._live_pool = HttpPool(
            f"{url.scheme}://{url.hostname}:{port}", {}, ssl_context=self.ssl_context
        )

    def _note_failure(self, reason: str) -> None:
        self.failures += 1
        self.last_error = reason

    def _heard(self) -> None:
        self._last_heard = asyncio.get_running_loop().time()

    def _mark_down(self, reason: str) -> None:
        if not self.breaker.trip():
            return
        log.warning("node %s marked down: %s", self.spec.id, reason)
        # Queued checks were never sent: they fail now, having consumed nothing.
        pending, self._pending, self._queued = self._pending, deque(), 0
        _fail(
            pending,
            lambda: NodeUnavailable(f"node {self.spec.id} is down ({CIRCUIT_OPEN})", Reason.DOWN),
        )
        if self._recovery is None or self._recovery.done():
            self._recovery = asyncio.get_running_loop().create_task(self._recover())

    def _check_liveness(self, reason: str) -> None:
        """After a refused or reset connection: down unless a fresh probe answers."""

        async def probe() -> None:
            if not await self._probe():
                self._mark_down(reason)

        self._spawn(probe())

    async def _probe(self) -> bool:
        """A liveness probe on a connection of its own: is the node process answering?

        Its liveness thread (node/health/liveness.py) answers however busy its event loop is.
        A refused liveness port may only mean the node restarted on a new one: then
        the main port's /healthz decides.
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        timeout = max(PROBE_TIMEOUT_S, RTT_FACTOR * self._rtt_peak)
        if self._live_pool is not None:
            try:
                status, _ = await self._live_pool.request("GET", "/", None, timeout, fresh=True)
            except TimeoutError:
                # Proof of a hang only if nothing was heard meanwhile and this router's own
                # loop kept time: a timeout that fired late says this process was stalled
                # (its connect or read callbacks queued behind other work), not the node.
                late = loop.time() - (started + timeout)
                return self._last_heard > started or late > OWN_STALL_S
            except OSError:
                self._live_pool.close()
                self._live_pool = self._live_port = None
            else:
                self._heard()
                return status == 200
        try:
            status, _ = await self.pool.request("GET", HEALTH_PATH, None, timeout, fresh=True)
        except TimeoutError:
            return True  # the main port queues behind the node's event loop: inconclusive
        except OSError:
            return False
        self._heard()
        return status == 200

    async def _watch(self) -> None:
        """While batches are in flight: a node silent for too long is probed."""
        loop = asyncio.get_running_loop()
        while self._sent_at and not self.breaker.is_open:
            await asyncio.sleep(WATCH_TICK_S)  # watch cadence, not a wait for a condition
            if not self._sent_at:
                return
            waiting_since = max(self._last_heard, min(self._sent_at.values()))
            if loop.time() - waiting_since < max(PROBE_AFTER_S, RTT_FACTOR * self._rtt_peak):
                continue
            if not await self._probe():
                self._mark_down(f"node {self.spec.id}: no answer to a liveness probe")

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
                log.warning("node %s is back", self.spec.id)
                self._heard()
                self.breaker.success()

    async def post(
        self, path: str, payload: Any, method: str = "POST", timeout_s: float | None = None
    ) -> Any:
        return await self._request(method, path, orjson.dumps(payload), timeout_s)

    async def get(self, path: str, timeout_s: float | None = None) -> Any:
        return await self._request("GET", path, None, timeout_s)

    async def _request(
        self, method: str, path: str, data: bytes | None, timeout_s: float | None
    ) -> Any:
        """One control request (not a batch); every failure becomes NodeUnavailable."""
        timeout = timeout_s if timeout_s is not None else self.deadline_s + self.margin_s
        try:
            status, raw = await self.pool.request(method, path, data, timeout)
            if status != 200:
                raise NodeUnavailable(f"node {self.spec.id} answered {status}: {_detail(raw)}")
            return orjson.loads(raw)
        except TimeoutError as exc:
            raise NodeUnavailable(f"node {self.spec.id}: timed out", Reason.TIMEOUT) from exc
        except (orjson.JSONDecodeError, OSError, ValueError) as exc:
            raise NodeUnavailable(f"node {self.spec.id}: {type(exc).__name__} {exc}") from exc

    async def close(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        for task in (self._watchdog, self._recovery, *self._tasks):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        pending, self._pending, self._queued = self._pending, deque(), 0
        _fail(pending, lambda: NodeUnavailable("router shutting down"))
        self.pool.close()
        self.link.close()
        if self._live_pool is not None:
            self._live_pool.close()
