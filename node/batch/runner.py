"""Running one batch of ops: the node's hot path, shared by the channel
(node/edge/channel_server.py) and the HTTP batch endpoint (node/app.py).

Nothing is applied after the batch's deadline (cluster/wire.py): a batch that arrives
late is answered `Expired` untouched; the batch script refuses once Redis' clock is past
it; and checks whose results are ready only after it are taken back before the answer
says `Expired`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine
from typing import Any

from cluster import wire
from node.batch.ops import Op, parse_op
from node.errors import BadOp, PeerError
from node.state import NodeState
from node.store.counter_store import (
    Plan,
    adjust_result,
    check_result,
    commit_result,
    refund_result,
)
from node.topology.ownership import Ownership, Role

__all__ = ["MAX_OPS", "run_batch", "start_batch"]

log = logging.getLogger("shardlimit.node")
MAX_OPS = 10_000


def _now_ms() -> int:
    return int(time.time() * 1000)


class _Prepared:
    """A batch checked against this node's topology: what is left to run in Redis."""

    __slots__ = ("deadline_ms", "epoch", "imports", "ownership", "results", "runnable", "slots")

    def __init__(self, deadline_ms: int, size: int, ownership: Ownership | None) -> None:
        self.deadline_ms = deadline_ms
        self.ownership = ownership  # what the ops were placed by (imports come from it)
        self.epoch = ownership.epoch if ownership is not None else 0
        self.results: list[wire.Result] = [wire.Expired()] * size
        self.runnable: list[Op] = []
        self.slots: list[int] = []
        self.imports: dict[str, list[str]] | None = None


def _prepare(
    state: NodeState, deadline_ms: int, ops: list[wire.Op], layout: int = 0
) -> _Prepared | None:
    """Parse and place the ops; None when the batch came past its deadline. Ops the
    router placed by this node's layout, outside a migration, are served as placed
    (wire.Request: the same layout places them the same way)."""
    state.metrics.batch_ops.observe(len(ops))
    if _now_ms() > deadline_ms:
        state.expired_batches += 1
        return None
    ownership = state.ownership
    batch = _Prepared(deadline_ms, len(ops), ownership)
    results, runnable, slots = batch.results, batch.runnable, batch.slots
    placed = (
        ownership is not None
        and layout != 0
        and layout == ownership.topology.layout_id
        and ownership.previous is None
    )
    for index, raw in enumerate(ops):
        try:
            op = parse_op(raw)
        except BadOp as exc:
            results[index] = wire.Failed(str(exc))
            continue
        if not placed:
            role, source = ownership.role(op.key) if ownership else (Role.MOVED, None)
            if role is Role.MOVED:
                results[index] = wire.Moved(batch.epoch)
                continue
            if role is Role.IMPORT and source is not None:
                if batch.imports is None:
                    batch.imports = defaultdict(list)
                batch.imports[source].extend(state.store.redis_keys(op))
        runnable.append(op)
        slots.append(index)
    return batch


def _fill(batch: _Prepared, outputs: list[Any]) -> bool:
    """Results from Redis' raw outputs; False when they came too late to count."""
    for index, op, out in zip(batch.slots, batch.runnable, outputs, strict=True):
        batch.results[index] = _result(op, out)
    return _now_ms() <= batch.deadline_ms


async def _too_late(state: NodeState, batch: _Prepared, outputs: list[Any]) -> None:
    """The router may have given up on this answer: take back what it consumed."""
    taken_back = await state.store.undo(list(zip(batch.runnable, outputs, strict=True)))
    state.expired_batches += 1
    state.undone_checks += taken_back
    log.warning("batch finished past its deadline: %d checks taken back", taken_back)
    for index, op in zip(batch.slots, batch.runnable, strict=True):
        if op.kind == "check":
            batch.results[index] = wire.Expired()


async def _release(state: NodeState, epoch: int) -> None:
    state.inflight[epoch] -= 1
    if state.epoch != epoch:
        # A newer topology waits for batches of older epochs to reach Redis.
        async with state.drained:
            state.drained.notify_all()


async def run_batch(state: NodeState, deadline_ms: int, ops: list[wire.Op]) -> list[wire.Result]:
    """One result per op, in order. Ops for keys this node does not own: `Moved`.
    Raises PeerError (moving keys could not be imported), RedisError or OSError."""
    batch = _prepare(state, deadline_ms, ops)
    if batch is None:
        return [wire.Expired()] * len(ops)
    if batch.runnable:
        state.inflight[batch.epoch] += 1
        try:
            await _run(state, batch)
        finally:
            await _release(state, batch.epoch)
    return batch.results


async def _run(state: NodeState, batch: _Prepared) -> None:
    ownership = batch.ownership
    if batch.imports and ownership is not None:
        # This node took the topology before its work of the older one drained: a copy
        # step may still be moving these very keys away. The pull comes after it.
        await state.wait_drained(batch.epoch)
        try:
            await _pull(state, ownership, batch.imports)
        except PeerError as exc:
            if exc.status != 409:
                raise
            # The previous owner serves the key again (a migration was aborted and it took
            # the newer topology first): nothing ran here, the router routes anew.
            for index in batch.slots:
                batch.results[index] = wire.Moved(batch.epoch)
            return
    outputs = await state.store.run(batch.runnable, batch.deadline_ms)
    if not _fill(batch, outputs):
        await _too_late(state, batch, outputs)


Answer = Callable[[list[wire.Result] | BaseException], None]


def start_batch(
    state: NodeState, deadline_ms: int, ops: list[wire.Op], answer: Answer, layout: int = 0
) -> None:
    """run_batch() for the channel: `answer` gets the results (or the exception). The
    common case, a batch of keys this node owns and a Redis connection already open,
    runs as callbacks, without a task; anything else goes through run_batch()."""
    batch = _prepare(state, deadline_ms, ops, layout)
    if batch is None:
        answer([wire.Expired()] * len(ops))
        return
    if not batch.runnable:
        answer(batch.results)
        return
    store = state.store
    plan = store.plan(batch.runnable, deadline_ms) if batch.imports is None else None
    state.inflight[batch.epoch] += 1

    def replied(raw: list[Any] | Exception) -> None:
        assert plan is not None
        if isinstance(raw, Exception):
            _spawn(state, batch, _raise(raw), answer)
            return
        outputs = store.results_now(plan, raw)
        if outputs is None:
            _spawn(state, batch, _complete(state, batch, plan, raw), answer)
        elif not _fill(batch, outputs):
            _spawn(state, batch, _too_late(state, batch, outputs), answer)
        elif state.epoch != batch.epoch:
            _spawn(state, batch, _nothing(), answer)
        else:
            state.inflight[batch.epoch] -= 1
            answer(batch.results)

    if plan is None or not store.send_now(plan, replied):
        _spawn(state, batch, _run(state, batch), answer)


async def _raise(error: BaseException) -> None:
    raise error


async def _nothing() -> None:
    pass


async def _complete(state: NodeState, batch: _Prepared, plan: Plan, raw: list[Any]) -> None:
    outputs = await state.store.complete(plan, raw)
    if not _fill(batch, outputs):
        await _too_late(state, batch, outputs)


_background: set[asyncio.Task[None]] = set()


def _spawn(
    state: NodeState, batch: _Prepared, work: Coroutine[Any, Any, None], answer: Answer
) -> None:
    """The rest of a batch as a task (the uncommon cases); it releases the batch's epoch."""

    async def finish() -> None:
        outcome: list[wire.Result] | BaseException = batch.results
        try:
            await work
        except Exception as exc:
            outcome = exc
        finally:
            await _release(state, batch.epoch)
        answer(outcome)

    task = asyncio.get_running_loop().create_task(finish())
    _background.add(task)
    task.add_done_callback(_background.discard)


def _result(op: Op, out: Any) -> wire.Result:
    if op.kind == "check" and type(out) is list:
        return check_result(out)
    if isinstance(out, Exception):
        return wire.Failed(str(out))
    if op.kind == "commit":
        return commit_result(out)
    if op.kind == "undo":
        return wire.Undone(int(out))
    if op.kind == "adjust":
        return adjust_result(out)
    return refund_result(out)


async def _pull(state: NodeState, ownership: Ownership, imports: dict[str, list[str]]) -> None:
    """First touch of moving keys: import them from their previous owner before serving."""
    assert ownership.migration_id is not None
    for source, keys in imports.items():
        spec = ownership.node_spec(source)
        if spec is None:
            raise PeerError(f"previous owner {source} unknown")
        pulled = await state.migrator.pull(ownership, spec.url, sorted(set(keys)))
        state.metrics.keys_pulled.inc(pulled)
