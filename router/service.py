"""The router's state and behaviour behind the HTTP handlers (router/api/): the cluster
view, rules, metrics, and deciding checks, batches and refunds."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from functools import partial
from typing import Any

import msgspec

from cluster import wire
from cluster.model import answers
from router.channel.op_group import Outcome
from router.channel.outcomes import result_failure
from router.config import RouterConfig
from router.control.cluster_view import Attempt, ClusterView, GroupAttempt
from router.control.resharding import Resharder
from router.decide.all_or_nothing import AllOrNothing
from router.decide.answers import decision, degraded_decision
from router.decide.denial_cache import DenialCache
from router.decide.leases import LeaseRequest, run_lease
from router.decide.quota_adjust import AdjustRequest, run_adjust
from router.decide.request_ids import reused_decision
from router.decide.spread import Spread
from router.errors import LeaseNotFound, NodeUnavailable, ReplayMismatch
from router.metrics import DecisionTally, RouterMetrics
from router.requests import CheckRequest, RefundRequest
from router.rules.book import RuleBook
from router.rules.cluster_rules import ClusterRules

log = logging.getLogger("shardlimit.router")


class Router:
    """State and behaviour behind the handlers; handlers only translate HTTP."""

    def __init__(
        self, config: RouterConfig, admin_token: str | None, cluster_token: str | None
    ) -> None:
        self.config = config
        self.admin_token = admin_token
        self.view = ClusterView(config, cluster_token)
        self.spread = Spread(self.view)
        self.denials = DenialCache()
        self.resharder = Resharder(self.view)
        self.rules = RuleBook(config.rules_file)
        self.cluster_rules = ClusterRules(self.view, self.rules)
        self.metrics = RouterMetrics()
        self.metrics.attach(self.view, self.rules, self.resharder)
        self.view.on_client = self.metrics.watch_client
        self.all_or_nothing = AllOrNothing(
            self.view, self.check, self.refund, hold_ms=config.aon_hold_ms
        )
        self._reloader: asyncio.Task[None] | None = None
        self._offers: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.rules.load()
        await self.view.start()
        await self.cluster_rules.start()
        self._reloader = asyncio.get_running_loop().create_task(self._watch_rules())

    async def stop(self) -> None:
        if self._reloader is not None:
            self._reloader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reloader
        for task in list(self._offers):
            task.cancel()
        await self.cluster_rules.close()
        await self.view.close()

    async def _watch_rules(self) -> None:
        while True:
            await asyncio.sleep(self.config.rules_poll_ms / 1000)  # polling cadence
            try:
                errors = self.rules.reload_errors
                if self.rules.reload_if_changed() and self.rules.reload_errors == errors:
                    log.info(
                        "rules file changed: %d rules in it, offered to the cluster",
                        len(self.rules.file_rules),
                    )
                    await self.cluster_rules.offer(self.rules.file_rules)
            except OSError as exc:
                log.error("rules file unreadable: %s", exc)

    def reload_rules(self) -> None:
        """SIGHUP: reload the file now (keep the old rules if it is bad) and publish it."""
        try:
            self.rules.load()
        except (*RuleBook.LOAD_ERRORS, OSError) as exc:
            log.error("rules reload failed: %s", exc)
            return
        offer = self.cluster_rules.offer(self.rules.file_rules)
        task = asyncio.get_running_loop().create_task(offer)
        self._offers.add(task)
        task.add_done_callback(self._offers.discard)

    async def check(
        self, request: CheckRequest, hold_ms: int = 0, batch: tuple[str, str] | None = None
    ) -> answers.Decision:
        if request.rule.cache_denials and batch is None:
            cached = self._cached_denial(request)
            if cached is not None:
                return cached
        op = request.to_op(self.config.idempotency_ttl_ms, hold_ms, batch, self.config.quota_ttl_ms)
        if request.rule.spread > 1:
            node, outcome = await self.spread.check(request, op)
            return self._conclude(request, node, outcome)
        return await self._decide(request, op)

    async def _decide(
        self, request: CheckRequest, op: wire.Op, first: Attempt | None = None
    ) -> answers.Decision:
        try:
            node, result = await self.view.execute(request.key, op, first)
        except NodeUnavailable as exc:
            return self._conclude(request, self.view.owner(request.key), exc)
        return self._conclude(request, node, result)

    def _conclude(
        self, request: CheckRequest, node: str, outcome: wire.Result | NodeUnavailable
    ) -> answers.Decision:
        """The decision body for a check's final outcome, counted in the metrics."""
        if isinstance(outcome, wire.Reused):
            return reused_decision(request, node)
        if isinstance(outcome, wire.Checked):
            try:
                body = decision(request, node, outcome)
            except ReplayMismatch as exc:
                return reused_decision(request, node, str(exc))
            self.metrics.checked(request, outcome)
            if request.rule.cache_denials and not outcome.allowed:
                self.denials.remember(request, outcome.limits, body)
        else:
            failure = outcome if isinstance(outcome, NodeUnavailable) else result_failure(outcome)
            reason, detail = failure.reason, str(failure)
            body = degraded_decision(request, node, f"{reason}: {detail}")
            self.metrics.degraded_decision(request, reason, body.allowed)
        return self._shadowed(request, body) if request.rule.shadow else body

    def _shadowed(self, request: CheckRequest, body: answers.Decision) -> answers.Decision:
        """A shadow rule's denial, answered as allowed (and counted as a shadow one)."""
        if body.allowed:
            return body
        self.metrics.shadow(request.rule.name).inc()
        return msgspec.structs.replace(body, allowed=True, retry_after_ms=None, shadow=True)

    def _cached_denial(self, request: CheckRequest) -> answers.Decision | None:
        body = self.denials.answer(request)
        if body is not None:
            self.metrics.cached_denial(request)
            if request.rule.shadow:
                return self._shadowed(request, body)
        return body

    async def refund(self, request: RefundRequest, *, void: bool = False) -> wire.Refunded:
        """Raises NodeUnavailable; returns the node's refund result."""
        op = request.to_op(void=void, quota_ttl_ms=self.config.quota_ttl_ms)
        try:
            if request.rule.spread > 1:
                return await self.spread.refund(request, op)
            _node, result = await self.view.execute(request.key, op)
        finally:  # after the node: a denial cached meanwhile predates the refund
            self.denials.forget(request.rule.name, request.key)
        if not isinstance(result, wire.Refunded):
            raise result_failure(result)
        return result

    async def adjust_quota(self, request: AdjustRequest) -> answers.QuotaAdjusted:
        """Restock or set a quota (router/decide/quota_adjust.py); raises as run_adjust does."""
        config = self.config
        try:
            return await run_adjust(
                self.view, request, config.idempotency_ttl_ms, config.quota_ttl_ms
            )
        finally:  # after the node: a denial cached meanwhile predates the restock
            self.denials.forget(request.rule.name, request.key)

    async def lease(self, request: LeaseRequest) -> answers.LeaseRenewed | answers.LeaseReleased:
        """Renew or release a lease (router/decide/leases.py); raises as run_lease does."""
        try:
            answer = await run_lease(self.view, request, self.config.quota_ttl_ms)
        except LeaseNotFound:
            self.metrics.lease_event(request.rule.name, "not_found")
            raise
        event = "renewed" if request.action == "renew" else "released"
        self.metrics.lease_event(request.rule.name, event)
        return answer

    async def batch(
        self, requests: list[CheckRequest], all_or_nothing: bool
    ) -> answers.BatchResult:
        if all_or_nothing:
            return await self.all_or_nothing.run(requests)
        if any(request.rule.spread > 1 or request.rule.cache_denials for request in requests):
            # Spread keys fall back from sub-counter to sub-counter, and cached denials
            # need no node: one check at a time.
            bodies = await asyncio.gather(*(self.check(request) for request in requests))
            return answers.BatchResult(allowed=all(b.allowed for b in bodies), results=list(bodies))
        # Every check is queued at once, one future per node rather than per check;
        # only those whose first answer needs a follow-up (moved, expired, timed out) go
        # on as tasks.
        ttl = self.config.idempotency_ttl_ms
        quota_ttl = self.config.quota_ttl_ms
        ops = [request.to_op(ttl, quota_ttl_ms=quota_ttl) for request in requests]
        sent = self.view.send_many([request.key for request in requests], ops)
        results: list[answers.Decision | None] = [None] * len(requests)
        follow_up: list[tuple[int, Attempt]] = []
        tally = DecisionTally()
        try:
            # Each node's share is decided as soon as it is in, while later nodes work.
            answered = _Answered(sent)
            while (attempt := await answered.next()) is not None:
                self._first_answers(requests, attempt, results, follow_up, tally)
        finally:
            tally.count(self.metrics)
        if follow_up:
            later = await asyncio.gather(
                *(self._decide(requests[i], ops[i], first) for i, first in follow_up)
            )
            for (index, _first), body in zip(follow_up, later, strict=True):
                results[index] = body
        done = [body for body in results if body is not None]
        return answers.BatchResult(allowed=all(r.allowed for r in done), results=done)

    def _first_answers(
        self,
        requests: list[CheckRequest],
        attempt: GroupAttempt,
        results: list[answers.Decision | None],
        follow_up: list[tuple[int, Attempt]],
        tally: DecisionTally,
    ) -> None:
        """Decide the checks of one node's share of a batch from their first answers;
        those needing a follow-up go into `follow_up`."""
        node_id = attempt.node_id
        settled = self.view.settled_outcome
        for index, outcome in zip(attempt.indexes, attempt.group.future.result(), strict=True):
            request = requests[index]
            if type(outcome) is wire.Checked and not request.rule.shadow:
                # The common answer, as _conclude makes it, counted once per batch.
                try:
                    results[index] = decision(request, node_id, outcome)
                except ReplayMismatch as exc:
                    results[index] = reused_decision(request, node_id, str(exc))
                else:
                    tally.add(request, outcome)
            elif not settled(node_id, outcome):
                follow_up.append((index, Attempt(node_id, attempt.epoch, _resolved(outcome))))
            elif isinstance(outcome, NodeUnavailable):
                results[index] = self._conclude(request, self.view.owner(request.key), outcome)
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                results[index] = self._conclude(request, node_id, outcome)

    def render_metrics(self) -> bytes:
        """The Prometheus exposition of this router (router/metrics.py)."""
        return self.metrics.render()


class _Answered:
    """A batch's node shares in the order their answers come in."""

    __slots__ = ("_gate", "_left", "_ready")

    def __init__(self, sent: list[GroupAttempt]) -> None:
        self._ready: deque[GroupAttempt] = deque()
        self._gate: asyncio.Future[None] | None = None
        self._left = len(sent)
        for attempt in sent:
            if attempt.group.future.done():
                self._ready.append(attempt)
            else:
                attempt.group.future.add_done_callback(partial(self._done, attempt))

    def _done(self, attempt: GroupAttempt, _future: asyncio.Future[Any]) -> None:
        self._ready.append(attempt)
        if self._gate is not None and not self._gate.done():
            self._gate.set_result(None)

    async def next(self) -> GroupAttempt | None:
        """The next share whose answers are in; None when every share has been taken."""
        if not self._left:
            return None
        if not self._ready:
            self._gate = asyncio.get_running_loop().create_future()
            await self._gate
        self._left -= 1
        return self._ready.popleft()


def _resolved(outcome: Outcome) -> asyncio.Future[wire.Result]:
    """A future already holding `outcome`, for `execute` to take as its first attempt."""
    future: asyncio.Future[wire.Result] = asyncio.get_running_loop().create_future()
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
    return future
