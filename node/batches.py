"""Running one batch of ops: the node's hot path, shared by the channel (node/channel.py)
and the HTTP batch endpoint (node/app.py).

Nothing is applied after the batch's deadline (cluster/wire.py): a batch that arrives
late is answered `Expired` untouched; the batch script refuses once Redis' clock is past
it; and checks whose results are ready only after it are taken back before the answer
says `Expired`.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any

from cluster import wire
from node.migration import PeerError
from node.ops import BadOp, Op, parse_op
from node.ownership import Ownership, Role
from node.state import NodeState
from node.store import adjust_result, check_result, commit_result, is_expired, refund_result

__all__ = ["MAX_OPS", "run_batch"]

log = logging.getLogger("shardlimit.node")
MAX_OPS = 10_000


def _now_ms() -> int:
    return int(time.time() * 1000)


async def run_batch(state: NodeState, deadline_ms: int, ops: list[wire.Op]) -> list[wire.Result]:
    """One result per op, in order. Ops for keys this node does not own: `Moved`.
    Raises PeerError (moving keys could not be imported), RedisError or OSError."""
    state.metrics.batch_ops.observe(len(ops))
    if _now_ms() > deadline_ms:
        state.expired_batches += 1
        return [wire.Expired()] * len(ops)
    results: list[wire.Result] = [wire.Expired()] * len(ops)
    runnable: list[Op] = []
    slots: list[int] = []
    ownership = state.ownership
    epoch = state.epoch
    imports: dict[str, list[str]] | None = None
    for index, raw in enumerate(ops):
        try:
            op = parse_op(raw)
        except BadOp as exc:
            results[index] = wire.Failed(str(exc))
            continue
        role, source = ownership.role(op.key) if ownership else (Role.MOVED, None)
        if role is Role.MOVED:
            results[index] = wire.Moved(epoch)
            continue
        if role is Role.IMPORT and source is not None:
            if imports is None:
                imports = defaultdict(list)
            imports[source].extend(state.store.redis_keys(op))
        runnable.append(op)
        slots.append(index)
    if not runnable:
        return results
    state.inflight[epoch] += 1
    try:
        if imports and ownership is not None:
            await _pull(state, ownership, imports)
        outputs = await state.store.run(runnable, deadline_ms)
        for index, op, out in zip(slots, runnable, outputs, strict=True):
            results[index] = _result(op, out)
        if _now_ms() > deadline_ms:
            # The router may have given up on this answer: take back what it consumed.
            taken_back = await state.store.undo(list(zip(runnable, outputs, strict=True)))
            state.expired_batches += 1
            state.undone_checks += taken_back
            log.warning("batch finished past its deadline: %d checks taken back", taken_back)
            for index, op in zip(slots, runnable, strict=True):
                if op.kind == "check":
                    results[index] = wire.Expired()
    finally:
        state.inflight[epoch] -= 1
        if state.epoch != epoch:
            # A newer topology waits for batches of older epochs to reach Redis.
            async with state.drained:
                state.drained.notify_all()
    return results


def _result(op: Op, out: Any) -> wire.Result:
    if isinstance(out, Exception):
        return wire.Failed(str(out))
    if op.kind == "check":
        return wire.Expired() if is_expired(out) else check_result(out)
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
