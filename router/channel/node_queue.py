"""A node's queue and batcher: the hot path of the router's client of one node.

Checks bound for the same node wait in one bounded queue and leave it as batches:
at most `max_inflight` batch requests are in flight per node, and checks arriving
meanwhile join the next batch, so under load batches grow instead of requests
multiplying (Gubernator's peer batching is the model). A full queue refuses at
once (`overloaded`); a node marked down fails new checks at once (nothing sent,
nothing consumed).

Every batch carries a deadline (cluster/wire/__init__.py). The router waits for it until
the deadline plus a margin, and the node guarantees nothing was applied that it
did not answer in time, so a batch given up on consumed nothing.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from cluster import wire
from router.channel.background import cancel
from router.channel.breaker import Breaker, down
from router.channel.link import Done, NodeLink
from router.channel.op_group import OpGroup
from router.errors import NodeUnavailable, Reason

# Queued ops, as runs: a run's outcomes go to one op's own future, or to an OpGroup's
# slots from `start` on (a group's run may leave in more than one batch). `layout`: the
# layout_id of the topology that placed the run's ops on this node (0: not placed by owner).
Sink = asyncio.Future[wire.Result] | OpGroup
Pending = tuple[list[wire.Op], Sink, int, int]
# A batch's outcome read (router/channel/outcomes.py): (ops, loop time sent, outcome).
ReadOutcome = Callable[
    [list[wire.Op], float, wire.Reply | BaseException], tuple[list[wire.Result], int]
]
# While batches are in flight (loop time each was sent): router/channel/watchdog.py.
Watch = Callable[[dict[int, float]], Coroutine[Any, Any, None]]
LateReply = Callable[[list[wire.Op], wire.Reply], None]


def _ignore(_value: float) -> None:
    pass


def fail_runs(runs: Iterable[Pending], error: Callable[[], NodeUnavailable]) -> None:
    """Every op of `runs` answered with an exception of its own."""
    for run, sink, start, _ in runs:
        if isinstance(sink, OpGroup):
            for index in range(start, start + len(run)):
                sink.settle(index, error())
        elif not sink.done():
            sink.set_exception(error())


class NodeQueue:
    def __init__(
        self,
        node_id: str,
        link: NodeLink,
        breaker: Breaker,
        *,
        deadline_s: float,
        margin_s: float,
        max_inflight: int,
        queue_max: int,
        coalesce_max: int,
        coalesce_wait_s: float,
        read_outcome: ReadOutcome,
        watch: Watch,
        on_late: LateReply,
        on_epoch: Callable[[str, int], None] | None,
    ) -> None:
        self.node_id = node_id
        self.link = link
        self.breaker = breaker
        self.deadline_s = deadline_s
        self.margin_s = margin_s
        self.max_inflight = max_inflight
        self.queue_max = queue_max
        self.coalesce_max = coalesce_max
        self.coalesce_wait_s = coalesce_wait_s
        self._read_outcome = read_outcome
        self._watch = watch
        self._on_late = on_late
        self.on_epoch = on_epoch
        self._pending: deque[Pending] = deque()
        self._queued = 0  # ops in `_pending`
        self._flush_handle: asyncio.Handle | None = None
        self._sent_at: dict[int, float] = {}  # in-flight batch id -> loop time sent
        self._batch_ids = 0
        self._watchdog: asyncio.Task[None] | None = None
        # Counters for /metrics.
        self.requests = 0
        self.ops = 0
        self.overloaded = 0
        # Observer for /metrics (router/metrics.py): ops per batch.
        self.on_batch: Callable[[int], None] = _ignore

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
            future.set_exception(down(self.node_id))
        elif self._queued >= self.queue_max:
            self.overloaded += 1
            future.set_exception(
                NodeUnavailable(
                    f"node {self.node_id}: {self.queue_max} checks already queued",
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
                group.settle(index, down(self.node_id))
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
                    f"node {self.node_id}: {self.queue_max} checks already queued",
                    Reason.OVERLOADED,
                ),
            )
        self._schedule()
        return group

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
            self._watchdog = loop.create_task(self._watch(self._sent_at))

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
                results, epoch = self._read_outcome(ops, started, outcome)
            except NodeUnavailable as exc:
                fail_runs(
                    batch,
                    functools.partial(
                        NodeUnavailable, str(exc), exc.reason, endpoint_down=exc.endpoint_down
                    ),
                )
            else:
                if self.on_epoch is not None:
                    self.on_epoch(self.node_id, epoch)
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
            on_late=functools.partial(self._on_late, ops),
            layout=layout,
        )

    async def exchange(self, ops: list[wire.Op]) -> tuple[list[wire.Result], int]:
        """One batch on the channel, outside the queue: (results in order, the node's
        epoch). For tests and tools."""
        answer: asyncio.Future[wire.Reply | BaseException] = (
            asyncio.get_running_loop().create_future()
        )
        started = asyncio.get_running_loop().time()
        self._start_exchange(ops, answer.set_result)
        return self._read_outcome(ops, started, await answer)

    def fail_queued(self, error: Callable[[], NodeUnavailable]) -> None:
        """Every queued op (never sent: it consumed nothing) fails with `error()`."""
        pending, self._pending, self._queued = self._pending, deque(), 0
        fail_runs(pending, error)

    def stop(self) -> None:
        """No further flush (the client is closing)."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()

    async def close(self) -> None:
        """Stop watching what is in flight and fail what is queued."""
        self.stop()
        await cancel(self._watchdog)
        self.fail_queued(lambda: NodeUnavailable("router shutting down"))
