"""Hot keys spread over sub-counters: a `spread: N` rule's check, read and refund.

The key K's budget lives in N sub-counters `K#0 .. K#N-1` (router/rules/spread_split.py
splits the limits; each sub-counter is an ordinary limit key the partitioner places
on its own). A check goes to one sub-counter; if that one cannot admit it, the
check tries each of the others in turn before it is denied, so no check is denied
while a sub-counter could still admit it, and the total admitted never exceeds the
limit (each sub-counter admits at most its share, atomically on its node).

Which sub-counter first: with a request_id, crc32(request_id) mod N, so a repeated
request takes the same path and meets the same idempotency records (every
sub-counter it tried recorded its own decision); a sub-counter that cannot answer
ends such a check degraded rather than skipping it, so a retry can never be
admitted twice. Without a request_id: round robin per router, and a sub-counter
whose node is unavailable is skipped.

A refund by request_id tries the sub-counters in that same order until one holds
the decision that consumed: exact, and it needs nothing remembered by a router.

Answers show the whole key: `limit` is the rule's limit, `remaining` the sum over
sub-counters. A denial has asked every sub-counter, so its sum is fresh; an admission
adds the admitting sub-counter's fresh value to the last value this router saw of
each other one (read once when the router first meets the key), so under concurrent
traffic it is an estimate. GET /v1/usage (and any `cost: 0` read) asks every
sub-counter and is exact.
"""

from __future__ import annotations

import asyncio
import random
import zlib
from collections.abc import Sequence

import msgspec

from cluster import wire
from cluster.model.algorithms import NONE
from cluster.model.keys import sub_key
from cluster.wire import Checked, LimitRow
from router.channel.outcomes import result_failure
from router.control.cluster_view import ClusterView
from router.errors import NodeUnavailable
from router.requests import CheckRequest, RefundRequest

SEEN_MAX = 100_000
# A refund's answers that end the search for the sub-counter holding its decision.
_FOUND = (
    wire.RefundStatus.REFUNDED,
    wire.RefundStatus.ALREADY_REFUNDED,
    wire.RefundStatus.OTHER_COUNTERS,
)
# The node that answered (or owns the sub-counter that could not) and its answer.
NodeAnswer = tuple[str, wire.Result | NodeUnavailable]


def first_index(request_id: str, n: int) -> int:
    return zlib.crc32(request_id.encode()) % n


def _sum(values: Sequence[int]) -> int:
    return NONE if NONE in values else sum(values)


def total_rows(
    rows_by_counter: Sequence[Sequence[LimitRow]], fresh: Sequence[LimitRow]
) -> list[LimitRow]:
    """Per limit: counts summed over every sub-counter; ok, reset, retry and delay from
    `fresh` (the deciding sub-counter's row)."""
    out: list[LimitRow] = []
    for j, row in enumerate(fresh):
        column = [rows[j] for rows in rows_by_counter]
        out.append(
            LimitRow(
                row.ok,
                _sum([r.limit for r in column]),
                _sum([r.remaining for r in column]),
                row.reset_after_ms,
                row.retry_after_ms,
                row.delay_ms,
                _sum([r.max_amount for r in column]),
                _sum([r.amount_remaining for r in column]),
            )
        )
    return out


def _wait(rows: Sequence[LimitRow]) -> int:
    """How long until this sub-counter could admit the check: its longest denying wait,
    NONE when one of its limits can never admit it."""
    waits = [row.retry_after_ms for row in rows if row.ok == 0]
    return NONE if not waits or NONE in waits else max(waits)


def denied_rows(all_rows: Sequence[Sequence[LimitRow]]) -> list[LimitRow]:
    """A denial by every sub-counter: sums, a limit denies when it denied anywhere, and
    every denying limit's retry is the soonest any sub-counter could admit."""
    waits = [w for w in (_wait(rows) for rows in all_rows) if w != NONE]
    retry = min(waits) if waits else NONE
    out = total_rows(all_rows, all_rows[0])
    return [
        msgspec.structs.replace(
            row,
            ok=int(all(rows[j].ok for rows in all_rows)),
            retry_after_ms=retry if not all(rows[j].ok for rows in all_rows) else NONE,
            reset_after_ms=max(rows[j].reset_after_ms for rows in all_rows),
        )
        for j, row in enumerate(out)
    ]


class Spread:
    """Checks, reads and refunds of spread keys, through the router's cluster view."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view
        self._turn = random.randrange(1 << 20)  # where this router starts its round robin
        # (scope, key, index) -> that sub-counter's rows as last seen by this router
        self._seen: dict[tuple[str, str, int], list[LimitRow]] = {}
        self.fallbacks = 0  # checks a first sub-counter could not admit, tried on others

    def _sub_op(self, request: CheckRequest | RefundRequest, op: wire.Op, index: int) -> wire.Op:
        return msgspec.structs.replace(
            op, key=sub_key(request.key, index), limits=list(request.rule.sub_wires[index])
        )

    def _remember(self, request: CheckRequest, index: int, rows: list[LimitRow]) -> None:
        if len(self._seen) >= SEEN_MAX:
            self._seen.clear()
        self._seen[(request.rule.name, request.key, index)] = rows

    def order(self, request: CheckRequest | RefundRequest, n: int) -> list[int]:
        if request.request_id is not None:
            start = first_index(request.request_id, n)
        else:
            self._turn += 1
            start = self._turn % n
        return [(start + step) % n for step in range(n)]

    async def check(self, request: CheckRequest, op: wire.Op) -> NodeAnswer:
        if op.cost == 0 and not any(op.amounts):
            return await self.read(request, op)
        n = request.rule.spread
        denials: list[list[LimitRow]] = []
        replays: list[bool] = []
        unavailable: NodeUnavailable | None = None
        node = ""
        for step, index in enumerate(self.order(request, n)):
            sub = self._sub_op(request, op, index)
            try:
                node, result = await self.view.execute(sub.key, sub)
            except NodeUnavailable as exc:
                if request.request_id is not None:
                    return self.view.owner(sub.key), exc
                unavailable = exc
                continue
            if not isinstance(result, Checked) or len(result.limits) != len(request.rule.limits):
                return node, result  # an error, or a replay made for other limits
            if not op.dry_run:  # a dry run's rows are as if it had consumed: not the state
                self._remember(request, index, result.limits)
            if result.allowed:
                if step:
                    self.fallbacks += 1
                return node, await self._admitted(request, op, index, result)
            denials.append(result.limits)
            replays.append(result.replayed)
        if unavailable is not None:
            return self.view.owner(sub_key(request.key, 0)), unavailable
        return node, Checked(False, all(replays), denied_rows(denials))

    async def _admitted(
        self, request: CheckRequest, op: wire.Op, index: int, result: Checked
    ) -> Checked:
        n = request.rule.spread
        scope, key = request.rule.name, request.key
        missing = [i for i in range(n) if i != index and (scope, key, i) not in self._seen]
        if missing:
            reads = msgspec.structs.replace(
                op, cost=0, amounts=[0] * len(op.amounts), request_id=None, dry_run=True
            )
            answers = await asyncio.gather(
                *(self._read_one(request, reads, i) for i in missing), return_exceptions=True
            )
            for i, answer in zip(missing, answers, strict=True):
                if isinstance(answer, list):
                    self._remember(request, i, answer)
        rows: list[Sequence[LimitRow]] = [result.limits]
        for i in range(n):
            if i != index:
                seen = self._seen.get((scope, key, i))
                if seen is None:  # unreadable right now: count its share as untouched
                    return result
                rows.append(seen)
        return msgspec.structs.replace(result, limits=total_rows(rows, result.limits))

    async def _read_one(self, request: CheckRequest, op: wire.Op, index: int) -> list[LimitRow]:
        sub = self._sub_op(request, op, index)
        _node, result = await self.view.execute(sub.key, sub)
        if not isinstance(result, Checked):
            raise result_failure(result, f"sub-counter {index}: ")
        return result.limits

    async def read(self, request: CheckRequest, op: wire.Op) -> NodeAnswer:
        """A `cost: 0` check (GET /v1/usage): every sub-counter, summed, exact."""
        n = request.rule.spread
        subs = [self._sub_op(request, op, i) for i in range(n)]
        try:
            answers = await asyncio.gather(*(self.view.execute(s.key, s) for s in subs))
        except NodeUnavailable as exc:
            return self.view.owner(request.key), exc
        results: list[Checked] = []
        for i, (node, result) in enumerate(answers):
            if not isinstance(result, Checked) or len(result.limits) != len(request.rule.limits):
                return node, result
            self._remember(request, i, result.limits)
            results.append(result)
        rows = [result.limits for result in results]
        allowed = all(result.allowed for result in results)
        combined = total_rows(rows, rows[0]) if allowed else denied_rows(rows)
        replayed = all(result.replayed for result in results)
        return answers[0][0], Checked(allowed, replayed, combined)

    async def refund(self, request: RefundRequest, op: wire.Op) -> wire.Refunded:
        """Give back what the sub-counter that admitted the decision consumed. Raises
        NodeUnavailable."""
        statuses: list[wire.RefundStatus] = []
        for index in self.order(request, request.rule.spread):
            sub = self._sub_op(request, op, index)
            _node, result = await self.view.execute(sub.key, sub)
            if not isinstance(result, wire.Refunded):
                raise result_failure(result, f"sub-counter {index}: ")
            if result.status in _FOUND:
                return result
            statuses.append(result.status)
        nothing = wire.RefundStatus.NOTHING_CONSUMED
        return wire.Refunded(nothing if nothing in statuses else wire.RefundStatus.UNKNOWN, [])
