"""Script replies -> results: a plan's replies put back in its ops' order, and each op's
raw result as its wire result (cluster/wire/batch.py)."""

from __future__ import annotations

from typing import Any

from cluster.wire import (
    Adjusted,
    AdjustStatus,
    Checked,
    Committed,
    Expired,
    Leased,
    LeaseStatus,
    LimitRow,
    Moved,
    Refunded,
    RefundStatus,
    Reused,
)
from node.store.script_calls import CHECK, Plan
from node.store.store_op import StoreOp

__all__ = [
    "EXPIRED_REPLY",
    "FENCED",
    "REUSED_REPLY",
    "SKEWED_REPLY",
    "adjust_result",
    "assemble",
    "check_result",
    "commit_result",
    "fenced_epoch",
    "is_expired",
    "lease_result",
    "refund_result",
    "undo_entries",
]

EXPIRED_REPLY = [-1]  # batch.lua: the deadline had passed, nothing applied
SKEWED_REPLY = [-2]  # batch.lua: a calendar period did not contain Redis' clock
REUSED_REPLY = [-3]  # batch.lua: the request_id names another request, nothing applied
# Any counter script: {FENCED, epoch} when an endpoint of the shard adopted a newer
# topology than the one the call's ops were placed by (common.lua `fenced`): nothing
# applied; the ops are answered Moved with that epoch.
FENCED = -4
# A check's reply: allowed, stored, n, then one row of ROW ints per limit (a LimitRow),
# then perhaps its packed undo entries.
_HEAD = 3
_ROW = 8


def assemble(plan: Plan, replies: list[Any]) -> list[Any]:
    """The raw result of each of the plan's ops, in their order; an error (an exception
    object) of batch.lua stands for each of its ops."""
    if not plan.others and len(plan.batched) == 1:  # the common case: one batch.lua call
        batch = replies[0]
        if isinstance(batch, Exception) or fenced_epoch(batch):
            return [batch] * len(plan.ops)
        return list(batch)
    results: list[Any] = [None] * len(plan.ops)
    for group, reply in zip(plan.batched, replies, strict=False):
        whole = isinstance(reply, Exception) or fenced_epoch(reply) > 0
        for position, i in enumerate(group):
            results[i] = reply if whole else reply[position]
    at = len(plan.batched)
    for i, reply in zip(plan.others, replies[at:], strict=True):
        results[i] = reply
    return results


def fenced_epoch(reply: Any) -> int:
    """The shard's newer epoch when a script refused to run (FENCED), else 0."""
    if type(reply) is list and len(reply) == 2 and reply[0] == FENCED:
        return int(reply[1])
    return 0


def is_expired(raw: Any) -> bool:
    return bool(raw == EXPIRED_REPLY)


def _packed_undo(raw: list[Any]) -> bytes | None:
    """A check reply's trailing undo entries (present when it consumed)."""
    end = _HEAD + _ROW * raw[2]
    extra = raw[end] if len(raw) > end else None
    return extra if isinstance(extra, bytes) else None


def undo_entries(op: StoreOp, raw: Any) -> bytes | None:
    """The packed undo entries of a check that consumed, else None."""
    if op.kind is not CHECK or not isinstance(raw, list) or len(raw) <= _HEAD:
        return None
    return _packed_undo(raw)


_EXPIRED = Expired()
_REUSED = Reused()


def check_result(raw: list[Any]) -> Checked | Reused | Expired | Moved:
    """batch.lua's reply for one check -> its wire result (with its undo entries)."""
    if len(raw) <= 2:
        if raw == EXPIRED_REPLY:
            return _EXPIRED
        if raw == REUSED_REPLY:
            return _REUSED
        if raw[0] == FENCED:
            return Moved(raw[1])
    n = raw[2]
    # raw[0]: 1 allowed, 0 denied, 2 a replay of a check its batch rolled back (refund.lua)
    if n == 1:  # the common case: one limit, its row and perhaps its undo entries
        undo = raw[11] if len(raw) > 11 and isinstance(raw[11], bytes) else None
        return Checked(raw[0] == 1, raw[1] == 1, [LimitRow(*raw[3:11])], undo, raw[0] == 2)
    rows = [LimitRow(*raw[_HEAD + _ROW * i : _HEAD + _ROW * (i + 1)]) for i in range(n)]
    return Checked(raw[0] == 1, raw[1] == 1, rows, _packed_undo(raw), raw[0] == 2)


def commit_result(raw: int) -> Committed:
    return Committed(raw == 1)


def adjust_result(raw: list[int]) -> Adjusted:
    if raw[0] not in (1, 2):
        return Adjusted(AdjustStatus(raw[0]))
    row = LimitRow(1, raw[1], raw[2], raw[3], -1, -1, raw[4], raw[5])
    return Adjusted(AdjustStatus(raw[0]), row)


def refund_result(raw: list[int]) -> Refunded:
    n = raw[1]
    given = [(raw[2 + 2 * i], raw[3 + 2 * i]) for i in range(n)] if raw[0] == 1 else []
    return Refunded(RefundStatus(raw[0]), given)


_LEASE_STATUS = {status.value: status for status in LeaseStatus}  # cheaper than calling it


def lease_result(raw: list[int]) -> Leased:
    """A renewal's or release's reply (concurrency.lua's `held`): status, Redis' clock
    (ms), the renewed lease's ttl_ms."""
    return Leased(_LEASE_STATUS[raw[0]], raw[1], raw[2])
