"""Node results -> the public decision body and RateLimit headers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from cluster.model import answers
from cluster.model.algorithms import BY_NAME, NONE
from cluster.model.lease_ids import lease_id
from cluster.model.limits import LimitSpec, format_amount
from cluster.model.ratelimit_headers import HeaderPlan, LimitState, header_values
from cluster.wire import Checked, LimitRow
from router.errors import ReplayMismatch
from router.requests import CheckRequest
from router.rules.book import Rule

T = TypeVar("T")


def _opt(value: int) -> int | None:
    return None if value == NONE else value


def _amount(minor: int, spec: LimitSpec) -> str | None:
    return None if minor == NONE else format_amount(minor, spec.amount_scale)


# The extra decision fields an algorithm may show (its record's view_fields).
_VIEW_FIELDS: dict[str, Callable[[LimitSpec, LimitRow], Any]] = {
    "period": lambda spec, _row: spec.period,
    "timezone": lambda spec, _row: spec.timezone,
    "max_amount": lambda spec, row: _amount(row.max_amount, spec),
    "amount_remaining": lambda spec, row: _amount(row.amount_remaining, spec),
    "delay_ms": lambda _spec, row: _opt(row.delay_ms),
    # concurrency: its row's limit slot holds the leases held (node/store/lua/concurrency.lua)
    "held": lambda _spec, row: row.limit,
}


def _limit_view(spec: LimitSpec, row: LimitRow) -> answers.LimitState:
    view_fields = BY_NAME[spec.algorithm].view_fields
    limit, remaining, reset = row.limit, row.remaining, row.reset_after_ms
    if not view_fields:
        return answers.LimitState(
            algorithm=spec.algorithm,
            limit=None if limit == NONE else limit,
            remaining=None if remaining == NONE else remaining,
            reset_after_ms=None if reset == NONE else reset,
        )
    extra = {name: _VIEW_FIELDS[name](spec, row) for name in view_fields}
    if spec.algorithm == "concurrency":
        limit = spec.limit or 0
    return answers.LimitState(
        algorithm=spec.algorithm,
        limit=_opt(limit),
        remaining=_opt(remaining),
        reset_after_ms=_opt(reset),
        **extra,
    )


class _Views:
    """What a rule's decisions share, worked out once per rule: its public name and how
    its node rows become LimitStates."""

    __slots__ = ("algorithm", "lease_at", "lease_limit", "public_name", "size", "specs")

    def __init__(self, rule: Rule) -> None:
        self.public_name = rule.public_name
        self.specs = rule.limits
        self.size = len(rule.limits)
        plain = all(not BY_NAME[spec.algorithm].view_fields for spec in rule.limits)
        # One plain limit (nearly every rule): built inline by `decision`.
        self.algorithm = rule.limits[0].algorithm if plain and self.size == 1 else None
        # The rule's concurrency limit (at most one), whose lease an allowed check holds.
        self.lease_at = rule.lease_at
        # A rule of that one limit (a lock, a pool): its limit, its view built inline.
        lone = self.size == 1 and self.lease_at == 0
        self.lease_limit = _opt(rule.limits[0].limit or 0) if lone else None

    def lease(self, rows: list[LimitRow]) -> answers.Lease | None:
        """The lease an allowed check acquired (none for a dry run or a cost of 0)."""
        if self.lease_at < 0:
            return None
        row = rows[self.lease_at]
        if row.max_amount == NONE:
            return None
        return answers.Lease(
            id=lease_id(row.max_amount, row.amount_remaining),
            fencing=row.max_amount,
            ttl_ms=self.specs[self.lease_at].window_ms,
            acquired_at_ms=row.delay_ms,
        )

    def views(self, rows: list[LimitRow]) -> list[answers.LimitState]:
        return [_limit_view(spec, row) for spec, row in zip(self.specs, rows, strict=True)]


class _PerRule(Generic[T]):
    """What `build` works out for a rule, kept with its rule (a rule replaced by a reload
    gets its own), for at most `size` rules."""

    def __init__(self, build: Callable[[Rule], T], size: int = 4096) -> None:
        self.build = build
        self.size = size
        self.kept: dict[int, tuple[Rule, T]] = {}

    def __call__(self, rule: Rule) -> T:
        entry = self.kept.get(id(rule))
        if entry is not None and entry[0] is rule:
            return entry[1]
        if len(self.kept) >= self.size:
            self.kept.clear()
        value = self.build(rule)
        self.kept[id(rule)] = (rule, value)
        return value


_views_of = _PerRule(_Views)


def decision(request: CheckRequest, node: str, result: Checked) -> answers.Decision:
    """Raises ReplayMismatch when the request_id was first used with other limits."""
    rows = result.limits
    plan = _views_of(request.rule)
    if len(rows) != plan.size:
        raise ReplayMismatch(
            f"request_id {request.request_id!r} was first used for key {request.key!r} with "
            f"{len(rows)} limit(s), not {plan.size}: a request_id names one check"
        )
    if plan.algorithm is not None:
        row = rows[0]
        limit, remaining, reset = row.limit, row.remaining, row.reset_after_ms
        limits = [
            answers.LimitState(
                algorithm=plan.algorithm,
                limit=None if limit == NONE else limit,
                remaining=None if remaining == NONE else remaining,
                reset_after_ms=None if reset == NONE else reset,
            )
        ]
    elif plan.lease_limit is not None:
        row = rows[0]
        remaining, reset = row.remaining, row.reset_after_ms
        limits = [  # as _limit_view makes it
            answers.LimitState(
                algorithm="concurrency",
                limit=plan.lease_limit,
                remaining=None if remaining == NONE else remaining,
                reset_after_ms=None if reset == NONE else reset,
                held=row.limit,
            )
        ]
    else:
        limits = plan.views(rows)
    if result.allowed:
        body = answers.Decision(
            allowed=True,
            key=request.key,
            rule=plan.public_name,
            node=node,
            retry_after_ms=None,
            limits=limits,
            denied_by=[],
            replayed=result.replayed,
            dry_run=request.dry_run,
        )
        if plan.lease_at >= 0:
            lease = plan.lease(rows)
            if lease is not None:
                body.lease = lease
        return body
    denied_by = [i for i, row in enumerate(rows) if row.ok == 0]
    waits = [rows[i].retry_after_ms for i in denied_by]
    body = answers.Decision(
        allowed=False,
        key=request.key,
        rule=plan.public_name,
        node=node,
        # A cost that can never fit has no retry time.
        retry_after_ms=None if not waits or NONE in waits else max(waits),
        limits=limits,
        denied_by=denied_by,
        replayed=result.replayed,
        dry_run=request.dry_run,
    )
    if result.rolled_back:  # a replay of a check its all-or-nothing batch rolled back
        body.rolled_back = True
    return body


def degraded_decision(request: CheckRequest, node: str, reason: str) -> answers.Decision:
    """A node could not answer in time: apply the rule's on_failure."""
    allowed = request.rule.on_failure == "allow"
    limits = [
        answers.LimitState(
            algorithm=spec.algorithm, limit=spec.limit, remaining=None, reset_after_ms=None
        )
        for spec in request.rule.limits
    ]
    return answers.Decision(
        allowed=allowed,
        key=request.key,
        rule=request.rule.public_name,
        node=node,
        retry_after_ms=None if allowed else 1000,
        limits=limits,
        denied_by=[] if allowed else list(range(len(limits))),
        replayed=False,
        dry_run=request.dry_run,
        degraded=True,
        degraded_reason=reason,
    )


_plan = _PerRule(lambda rule: HeaderPlan(rule.public_name or "inline", rule.limits))


def ratelimit_headers(request: CheckRequest, body: answers.Decision) -> dict[str, str]:
    """RateLimit-Policy / RateLimit / Retry-After (cluster/model/ratelimit_headers.py)."""
    retry = None if body.allowed else body.retry_after_ms
    if len(body.limits) == len(request.rule.limits):
        return _plan(request.rule).values(body.limits, retry)
    states = [LimitState(view.limit, view.remaining, view.reset_after_ms) for view in body.limits]
    return header_values(request.rule.public_name or "inline", request.rule.limits, states, retry)
