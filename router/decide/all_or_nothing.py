"""All-or-nothing batches over several nodes: two phases, settled by one record.

Every check is first *held* (consumed, and settled by its node's sweeper unless
committed within `aon_hold`). If all were allowed, "commit" is recorded on the
batch's coordinator node (SET NX: a sweeper that found the batch undecided
recorded "abort" there first, and then it stays aborted), and only then are the
holds committed; otherwise they are rolled back. A router dying anywhere in
between leaves holds that every node settles by the coordinator's record: all
committed or all given back.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from decimal import Decimal

from msgspec import UNSET
from msgspec.structs import replace

from cluster import wire
from cluster.model import answers
from cluster.model.keys import hold_id
from cluster.model.limits import format_amount
from router.control.cluster_view import ClusterView
from router.errors import NodeUnavailable
from router.requests import CheckRequest, RefundRequest

__all__ = ["AllOrNothing"]

log = logging.getLogger("shardlimit.router")
DECISION_TIMEOUT_S = 1.0
# (request, hold_ms, (batch id, coordinator)) -> the decision body
Check = Callable[[CheckRequest, int, tuple[str, str] | None], Awaitable[answers.Decision]]
Refund = Callable[..., Awaitable[wire.Refunded]]


def _held(request: CheckRequest, body: answers.Decision) -> bool:
    """Whether the check may have left a hold on its node (batch.lua: a recorded
    decision that consumed something). A degraded answer counts: its check may have
    reached the node after all. Naming a hold that does not exist only keeps the
    decision record longer; missing one could let it expire too early."""
    if not body.allowed or body.replayed or request.dry_run:
        return False
    return request.cost > 0 or any(amount > 0 for amount in request.amounts)


def _restore(request: CheckRequest, body: answers.Decision, given: list[tuple[int, int]]) -> None:
    """The decision's limits as they stand after its rollback gave back `given` (per
    limit: count, amount in minor units): what it had consumed is remaining again."""
    for spec, view, (count, amount) in zip(request.rule.limits, body.limits, given, strict=False):
        if count and view.remaining is not None:
            remaining = view.remaining + count
            view.remaining = remaining if view.limit is None else min(remaining, view.limit)
        if amount and isinstance(view.amount_remaining, str):
            scale = spec.amount_scale
            minor = int(Decimal(view.amount_remaining).scaleb(scale)) + amount
            if isinstance(view.max_amount, str):
                minor = min(minor, int(Decimal(view.max_amount).scaleb(scale)))
            view.amount_remaining = format_amount(minor, scale)


class AllOrNothing:
    def __init__(self, view: ClusterView, check: Check, refund: Refund, *, hold_ms: int) -> None:
        self.view = view
        self.check = check
        self.refund = refund
        self.hold_ms = hold_ms

    async def run(self, requests: list[CheckRequest]) -> answers.BatchResult:
        # Every consuming check needs a request id so a denial can roll it back exactly.
        tag = uuid.uuid4().hex
        requests = [
            r if r.request_id is not None else replace(r, request_id=f"~aon:{tag}:{i}")
            for i, r in enumerate(requests)
        ]
        owners = (self.view.owner(r.key) for r in requests)
        channels = self.view.clients
        coordinator = next(
            (o for o in owners if o in channels and channels[o].state == "up"),
            self.view.owner(requests[0].key),
        )
        batch = (tag, coordinator)
        results = list(
            await asyncio.gather(*(self.check(r, self.hold_ms, batch) for r in requests))
        )
        decision: str | None = "abort"
        if all(r.allowed for r in results):
            holds = [
                hold_id(r.request_id, r.key)
                for r, body in zip(requests, results, strict=True)
                if r.request_id is not None and _held(r, body)
            ]
            decision = await self._decide(*batch, holds)
        if decision == "commit":
            await self._commit(requests, results)
        elif decision == "abort":
            await self._roll_back(requests, results)
        else:
            # The coordinator could not be reached: the nodes' sweepers will settle
            # the holds by its record once it answers. Until then, not admitted.
            for body in results:
                if body.allowed:
                    body.allowed = False
                    body.degraded = True
                    body.lease = UNSET  # given back by the sweeper, or committed: not yours
        return answers.BatchResult(allowed=decision == "commit", results=results)

    async def _decide(self, batch: str, coordinator: str, holds: list[str]) -> str | None:
        """Record "commit" for the batch unless it was aborted; the decision that stands.

        If the answer is lost, asking again to "abort" returns whatever was recorded.
        `holds` names the batch's holds: a "commit" record lasts until each of them
        was reported settled by its node, however long that takes.
        """
        channel = self.view.clients.get(coordinator)
        if channel is None:
            return "abort"
        if channel.breaker.is_open:
            return None
        for wanted in ("commit", "abort"):
            try:
                body = await channel.post(
                    wire.DECISION_PATH,
                    {"batch": batch, "decision": wanted, "holds": holds},
                    timeout_s=DECISION_TIMEOUT_S,
                )
            except NodeUnavailable as exc:
                log.error("batch %s: decision %s not recorded: %s", batch, wanted, exc)
                continue
            decision = body.get("decision") if isinstance(body, dict) else None
            if decision in ("commit", "abort"):
                return str(decision)
        return None

    async def _commit(self, requests: list[CheckRequest], results: list[answers.Decision]) -> None:
        """Make the holds final now; any not reached are committed by their node's sweeper."""

        async def commit(request: CheckRequest, body: answers.Decision) -> None:
            if body.replayed or body.degraded or request.dry_run:
                return
            assert request.request_id is not None
            op = RefundRequest(request.key, request.rule, request.request_id).to_op(kind="commit")
            try:
                await self.view.execute(request.key, op)
            except NodeUnavailable as exc:
                log.warning("commit of %r left to its node's sweeper: %s", request.key, exc)

        await asyncio.gather(*(commit(r, b) for r, b in zip(requests, results, strict=True)))

    async def _roll_back(
        self, requests: list[CheckRequest], results: list[answers.Decision]
    ) -> None:
        async def undo(request: CheckRequest, body: answers.Decision) -> None:
            consumed = not (body.replayed or body.degraded or request.dry_run)
            if body.allowed and request.dry_run and not body.degraded:
                # Its rows are what it would have left: as it stands is what it left.
                now = replace(request, cost=0, amounts=(0,) * len(request.amounts), request_id=None)
                body.limits = (await self.check(now, 0, None)).limits
            if body.allowed and consumed and request.request_id is not None:
                refund = RefundRequest(request.key, request.rule, request.request_id)
                try:
                    refunded = await self.refund(refund, void=True)
                    if refunded.status == wire.RefundStatus.REFUNDED:
                        _restore(request, body, refunded.given)
                except NodeUnavailable as exc:
                    log.error("rollback of %r failed: %s", request.key, exc)
                    body.rollback_failed = True
            if body.allowed:
                body.allowed = False
                body.rolled_back = True
                body.lease = UNSET  # the rollback released it

        await asyncio.gather(*(undo(r, b) for r, b in zip(requests, results, strict=True)))
