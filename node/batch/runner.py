"""Running one batch of ops: the node's hot path, shared by the channel
(node/edge/channel_server.py) and the HTTP batch endpoint (node/edge/batch_api.py).

Nothing is applied after the batch's deadline (cluster/wire/__init__.py): a batch that arrives
late is answered `Expired` untouched; the batch script refuses once Redis' clock is past
it; and checks whose results are ready only after it are taken back before the answer
says `Expired`.

Nothing is applied either once another endpoint of the shard adopted a newer topology
than the one the batch was placed by (the shard's epoch fence, node/store/lua/common.lua):
the scripts refuse, this node adopts the topology the shard keeps, and the refused ops
are answered `Moved` with its epoch, as ops for keys it does not own are.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from cluster import wire
from cluster.wire import OpKind
from node.batch.lost_reply import MAX_SENDS, keep_resendable, take_back_expired
from node.batch.ops import CHECK, Op, parse_op
from node.batch.prepared import PreparedBatch
from node.errors import BadOp, PeerError
from node.state import NodeState
from node.store.counter_store import (
    ReplicaAcks,
    adjust_result,
    check_result,
    commit_result,
    fenced_epoch,
    lease_result,
    refund_result,
)
from node.store.reply_errors import write_refusal
from node.topology.ownership import Ownership, Role

__all__ = ["MAX_OPS", "run_batch", "start_batch"]

log = logging.getLogger("shardlimit.node")
MAX_OPS = 10_000
UNREPLICATED: Final = wire.Expired(unreplicated=True)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _prepare(
    state: NodeState, deadline_ms: int, ops: list[wire.Op], layout: int = 0
) -> PreparedBatch | list[wire.Result]:
    """Parse and place the ops; the final results instead when nothing is left to run
    (the batch came past its deadline, or no op is for this node). Ops the router placed
    by this node's layout, outside a migration, are served as placed (wire.Request: the
    same layout places them the same way)."""
    state.metrics.batch_ops.observe(len(ops))
    if _now_ms() > deadline_ms:
        state.expired_batches += 1
        return [wire.Expired()] * len(ops)
    ownership = state.current.ownership
    batch = PreparedBatch(deadline_ms, len(ops), ownership, state.failovers)
    no_replica = state.store.replicated and state.replicas.absent
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
        if no_replica and op.durable:  # it would only wait for a WAIT to time out
            state.metrics.unreplicated.inc()
            results[index] = UNREPLICATED
            continue
        if not placed and role is Role.IMPORT and source is not None:
            if batch.imports is None or batch.importing is None:
                batch.imports, batch.importing = defaultdict(list), {}
            batch.imports[source].extend(state.store.redis_keys(op))
            batch.importing[len(runnable)] = source
        runnable.append(op)
        slots.append(index)
    return batch if runnable else results


def _fill(batch: PreparedBatch, outputs: list[Any]) -> bool:
    """Results from Redis' raw outputs; False when they came too late to count."""
    for index, op, out in zip(batch.slots, batch.runnable, outputs, strict=True):
        batch.results[index] = _result(op, out)
    return _now_ms() <= batch.deadline_ms


async def _too_late(state: NodeState, batch: PreparedBatch, outputs: list[Any]) -> None:
    """The router may have given up on this answer: take back what it consumed."""
    taken_back = await state.store.undo(
        list(zip(batch.runnable, outputs, strict=True)),
        recorded_only=state.failovers != batch.failovers,
    )
    state.expired_batches += 1
    state.undone_checks += taken_back
    log.warning("batch finished past its deadline: %d checks taken back", taken_back)
    for index, op in zip(batch.slots, batch.runnable, strict=True):
        if op.kind is CHECK:
            batch.results[index] = wire.Expired()


async def _take_back_durable(
    state: NodeState, batch: PreparedBatch, outputs: list[Any]
) -> list[Any]:
    """No replica held the batch in time: its `durability: replica` checks could be lost
    to a failover, so they are taken back and answered degraded. The rest stands; the
    outputs of the rest are returned, and the batch keeps only them."""
    durable = [i for i, op in enumerate(batch.runnable) if op.durable and op.kind is CHECK]
    taken = [(batch.runnable[i], outputs[i]) for i in durable]
    state.undone_checks += await state.store.undo(
        taken, recorded_only=state.failovers != batch.failovers
    )
    state.metrics.unreplicated.inc(len(durable))
    log.warning("batch not held by a replica in time: %d checks taken back", len(durable))
    for i in durable:
        batch.results[batch.slots[i]] = UNREPLICATED
    keep = [i for i, op in enumerate(batch.runnable) if not (op.durable and op.kind is CHECK)]
    batch.runnable = [batch.runnable[i] for i in keep]
    batch.slots = [batch.slots[i] for i in keep]
    return [outputs[i] for i in keep]


async def _outputs_in(
    state: NodeState, batch: PreparedBatch, outputs: Awaitable[list[Any]]
) -> None:
    """The results once Redis' outputs are in, taken back if they came too late."""
    await _settle(state, batch, await outputs)


async def _settle(state: NodeState, batch: PreparedBatch, outputs: list[Any]) -> None:
    batch.moved_on = max(map(fenced_epoch, outputs), default=0)
    if not _fill(batch, outputs):
        await _too_late(state, batch, outputs)


async def _catch_up(state: NodeState, batch: PreparedBatch) -> None:
    """Some ops were refused: the shard is at a newer topology. Adopt it before the
    `Moved` answers go out (the router asks this node for it next). Called once the
    batch no longer counts as work of its epoch: the adoption waits for that work."""
    try:
        await state.kept.catch_up()
    except (RedisError, OSError) as exc:
        epoch = batch.moved_on
        log.warning("the shard is at epoch %d; could not adopt its topology: %s", epoch, exc)


async def run_batch(state: NodeState, deadline_ms: int, ops: list[wire.Op]) -> list[wire.Result]:
    """One result per op, in order. Ops for keys this node does not own: `Moved`; for
    moving keys their previous owner could not hand over: `Expired(unavailable=why)`.
    Raises RedisError or OSError (this node's Redis).
    start_batch() below is the same with its common case run as callbacks."""
    batch = _prepare(state, deadline_ms, ops)
    if isinstance(batch, list):
        return batch
    async with state.gate.hold(batch.epoch):
        await _run(state, batch)
    if batch.moved_on:
        await _catch_up(state, batch)
    return batch.results


async def _run(state: NodeState, batch: PreparedBatch) -> None:
    ownership = batch.ownership
    if batch.imports and ownership is not None:
        # This node took the topology before its work of the older one drained: a copy
        # step may still be moving these very keys away. The pull comes after it.
        await state.gate.drained(batch.epoch)
        try:
            unimported = await _pull(state, ownership, batch.imports)
        except PeerError:
            # The previous owner serves the key again (a migration was aborted and it took
            # the newer topology first): nothing ran here, the router routes anew.
            for index in batch.slots:
                batch.results[index] = wire.Moved(batch.epoch)
            return
        if unimported and not _drop_unimported(batch, unimported):
            return
    await _run_in_redis(state, batch)


async def _run_in_redis(state: NodeState, batch: PreparedBatch, sends: int = 1) -> None:
    """The batch's ops run in Redis and their results filled in; `sends`: this is its
    sends-th, its connection to Redis lost under each earlier one."""
    acks = _replica_acks(state, batch)
    try:
        outputs = await state.store.run(batch.runnable, batch.deadline_ms, acks, batch.epoch)
    except RedisConnectionError as lost:
        if sends >= MAX_SENDS:
            raise
        await _after_lost(state, batch, lost, sends)
        return
    if sends > 1:
        await take_back_expired(state, batch, outputs)
    if acks is not None and acks.missing:
        state.metrics.replica_timeouts.inc()
        state.replicas.fell_short(acks.acked)
        outputs = await _take_back_durable(state, batch, outputs)
    await _settle(state, batch, outputs)


async def _after_lost(
    state: NodeState, batch: PreparedBatch, lost: RedisConnectionError, sends: int
) -> None:
    """The connection to Redis was lost under the batch's `sends`-th send (node/batch/
    lost_reply.py). With nothing to send again, its ops stand answered as possibly
    applied while Redis answers; when it does not, the batch fails (503, as a Redis gone)."""
    if keep_resendable(batch, lost):
        await _run_in_redis(state, batch, sends + 1)
    else:
        await state.redis.ping()


def _replica_acks(state: NodeState, batch: PreparedBatch) -> ReplicaAcks | None:
    """A WAIT for the batch when the shard has replicas and an op asks for one. It waits
    half the time left, so the rest of a batch whose WAIT times out is still answered
    by the deadline."""
    if not state.store.replicated or not any(op.durable for op in batch.runnable):
        return None
    return ReplicaAcks((batch.deadline_ms - _now_ms()) // 2, state.replicas.needed)


Answer = Callable[[list[wire.Result] | BaseException], None]


def start_batch(
    state: NodeState, deadline_ms: int, ops: list[wire.Op], answer: Answer, layout: int = 0
) -> None:
    """run_batch() for the channel: `answer` gets the results (or the exception). The
    common case, a batch of keys this node owns and a Redis connection already open,
    runs as callbacks, without a task; anything else finishes as run_batch() does, in
    a task."""
    batch = _prepare(state, deadline_ms, ops, layout)
    if isinstance(batch, list):
        answer(batch)
        return
    store, gate, epoch = state.store, state.gate, batch.epoch
    fast = batch.imports is None and not store.replicated  # a replica's WAIT: run_batch's way
    plan = store.plan(batch.runnable, deadline_ms, epoch) if fast else None
    gate.enter(epoch)

    def replied(raw: list[Any] | Exception) -> None:
        assert plan is not None
        if isinstance(raw, Exception):
            if isinstance(raw, RedisConnectionError):
                _spawn(state, batch, _after_lost(state, batch, raw, 1), answer)
            else:
                _spawn(state, batch, _raise(raw), answer)
            return
        outputs = store.results_now(plan, raw)
        if outputs is None:
            _spawn(state, batch, _outputs_in(state, batch, store.complete(plan, raw)), answer)
        elif not _fill(batch, outputs):
            _spawn(state, batch, _too_late(state, batch, outputs), answer)
        else:
            gate.leave(epoch)
            answer(batch.results)

    if plan is None or not store.send_now(plan, replied):
        _spawn(state, batch, _run(state, batch), answer)


async def _raise(error: BaseException) -> None:
    raise error


_background: set[asyncio.Task[None]] = set()


def _spawn(
    state: NodeState, batch: PreparedBatch, work: Coroutine[Any, Any, None], answer: Answer
) -> None:
    """The rest of a batch as a task (the uncommon cases); it releases the batch's epoch."""

    async def finish() -> None:
        outcome: list[wire.Result] | BaseException = batch.results
        try:
            await work
        except Exception as exc:
            outcome = exc
        finally:
            state.gate.leave(batch.epoch)
        try:
            if batch.moved_on:
                await _catch_up(state, batch)
        finally:
            answer(outcome)

    task = asyncio.get_running_loop().create_task(finish())
    _background.add(task)
    task.add_done_callback(_background.discard)


def _undone(out: Any) -> wire.Result:
    return wire.Undone(int(out))


# What Redis' output for an op of each kind becomes. A check's output is a list, read
# before the table is looked at (the fast path); a check's entry here only meets a reply
# of no known shape, which refund_result fails on (an error, not a guessed answer).
_RESULTS: Final[dict[OpKind, Callable[[Any], wire.Result]]] = {
    OpKind.CHECK: refund_result,
    OpKind.REFUND: refund_result,
    OpKind.COMMIT: commit_result,
    OpKind.UNDO: _undone,
    OpKind.ADJUST: adjust_result,
    OpKind.RENEW: lease_result,
    OpKind.RELEASE: lease_result,
}


def _result(op: Op, out: Any) -> wire.Result:
    if op.kind is CHECK and type(out) is list:
        return check_result(out)
    if isinstance(out, Exception):
        refusal = write_refusal(out)
        if refusal is None:
            return wire.Failed(str(out))
        why = f"the shard's Redis {refusal}: it refused the write, and nothing was consumed"
        return wire.Failed(why, refused=True)
    moved_on = fenced_epoch(out)
    if moved_on:
        return wire.Moved(moved_on)
    return _RESULTS[op.kind](out)


async def _pull(
    state: NodeState, ownership: Ownership, imports: dict[str, list[str]]
) -> dict[str, str]:
    """First touch of moving keys: import them from their previous owners before serving.
    The owners whose keys could not be imported, and why. Raises PeerError (409) when an
    owner serves its keys again."""
    assert ownership.migration_id is not None
    unimported: dict[str, str] = {}
    for source, keys in imports.items():
        spec = ownership.node_spec(source)
        try:
            if spec is None:
                raise PeerError(f"previous owner {source} unknown")
            pulled = await state.migrator.pull(ownership, spec.urls, sorted(set(keys)))
        except PeerError as exc:
            if exc.status == 409:
                raise
            unimported[source] = f"could not import moving keys from {source}: {exc}"
            continue
        state.metrics.keys_pulled.inc(pulled)
    return unimported


def _drop_unimported(batch: PreparedBatch, unimported: dict[str, str]) -> bool:
    """The ops whose keys' previous owner could not hand them over are answered so, one by
    one (the batch's other ops run: this node is fine); False when none is left to run."""
    kept: list[int] = []
    importing = batch.importing or {}
    for place, index in enumerate(batch.slots):
        why = unimported.get(importing.get(place, ""))
        if why is None:
            kept.append(place)
        else:
            batch.results[index] = wire.Expired(unavailable=why)
    batch.runnable = [batch.runnable[place] for place in kept]
    batch.slots = [batch.slots[place] for place in kept]
    batch.importing = None
    return bool(batch.runnable)
