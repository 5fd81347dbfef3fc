"""A batch whose connection to Redis was lost after it was sent: whether it ran there is
unknown. Its checks with a request_id go again (one that ran answers from its record, and
counts once), but `durability: replica` ones; every other op is answered as possibly
applied. A check that the deadline refuses by its next send is taken back by its record,
which keeps what it consumed (docs/guarantees.md)."""

from __future__ import annotations

import logging
from typing import Any, Final

from cluster import wire
from node.batch.ops import CHECK
from node.batch.prepared import PreparedBatch
from node.state import NodeState
from node.store.replies import is_expired

__all__ = ["MAX_SENDS", "keep_resendable", "take_back_expired"]

log = logging.getLogger("shardlimit.node")
MAX_SENDS: Final = 3  # of a batch to Redis, when the connection is lost under it


def keep_resendable(batch: PreparedBatch, lost: BaseException) -> bool:
    """Answer every op of the batch as possibly applied, and keep to run again only the
    checks that may go again; whether any is left."""
    # Not a durable check: a replay writes nothing, and the WAIT after it would not cover
    # the first send's write, which may never have reached a replica.
    again = [
        i
        for i, op in enumerate(batch.runnable)
        if op.kind is CHECK and op.request_id and not op.durable
    ]
    undecided = wire.Failed(f"{lost}: this op may have been applied")
    for index in batch.slots:
        batch.results[index] = undecided
    log.warning(
        "connection to Redis lost under a batch: %d checks sent again by request_id, "
        "%d other ops answered undecided",
        len(again),
        len(batch.slots) - len(again),
    )
    batch.runnable = [batch.runnable[i] for i in again]
    batch.slots = [batch.slots[i] for i in again]
    return bool(again)


async def take_back_expired(state: NodeState, batch: PreparedBatch, outputs: list[Any]) -> None:
    """Checks sent again that the deadline has now refused may have run on an earlier
    send: taken back by their records, so their `Expired` answer consumed nothing."""
    expired = [op for op, out in zip(batch.runnable, outputs, strict=True) if is_expired(out)]
    if expired:
        taken_back = await state.store.take_back_recorded(expired)
        state.undone_checks += taken_back
        log.warning("checks sent again past their deadline: %d taken back", taken_back)
