"""What the SDK's calls return: decisions (cluster/sdk/decisions.py), refunds, quota
adjustments, rules; each read from the router's answer."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from cluster.model import answers
from cluster.sdk.decisions import Decision, LeaseGrant, LimitState
from cluster.sdk.errors import RequestIdReused, all_decisions, is_reused

_V = TypeVar("_V")


@dataclass(frozen=True, slots=True)
class GivenBack:
    """What a refund returned to one limit."""

    algorithm: str
    count: int
    amount: Decimal | None = None


@dataclass(frozen=True, slots=True)
class RefundResult:
    """The answer to a refund; `refunded` is False when the decision consumed nothing."""

    refunded: bool
    key: str
    rule: str | None
    request_id: str
    given_back: tuple[GivenBack, ...] = ()
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class RuleInfo:
    """A rule as `GET /v1/rules/{name}` describes it (limits as the rules file writes them)."""

    name: str
    limits: tuple[dict[str, Any], ...]
    on_failure: str


@dataclass(frozen=True)
class QuotaAdjustment:
    """The answer of POST /v1/quota/adjust: the quota after the adjustment."""

    key: str
    rule: str
    request_id: str
    replayed: bool  # the same request_id was applied before: nothing changed now
    limit: int | None
    remaining: int | None
    max_amount: Decimal | None
    amount_remaining: Decimal | None


# The answers are decoded with the Structs the router encodes (cluster/model/answers.py),
# then given the friendlier shape above: Decimal amounts, tuples, None for absent fields.


def _given(value: _V | UnsetType) -> _V | None:
    return None if isinstance(value, UnsetType) else value


def _decimal(value: str | UnsetType | None) -> Decimal | None:
    return None if value is None or value is UNSET else Decimal(str(value))


def _limit_state(view: answers.LimitState) -> LimitState:
    if (
        view.delay_ms is UNSET
        and view.max_amount is UNSET
        and view.amount_remaining is UNSET
        and view.period is UNSET
        and view.timezone is UNSET
        and view.held is UNSET
    ):  # a limit without extra fields (nearly all)
        return LimitState(view.algorithm, view.limit, view.remaining, view.reset_after_ms)
    return LimitState(
        view.algorithm,
        view.limit,
        view.remaining,
        view.reset_after_ms,
        _given(view.delay_ms),
        _decimal(view.max_amount),
        _decimal(view.amount_remaining),
        _given(view.period),
        _given(view.timezone),
        _given(view.held),
    )


def _from_body(body: answers.Decision) -> Decision:
    views = body.limits
    rolled_back, rollback_failed, reason = (
        body.rolled_back,
        body.rollback_failed,
        body.degraded_reason,
    )
    return Decision(
        body.allowed,
        body.key,
        body.rule,
        body.node,
        body.retry_after_ms,
        (_limit_state(views[0]),) if len(views) == 1 else tuple(map(_limit_state, views)),
        tuple(body.denied_by),
        body.replayed,
        body.dry_run,
        body.degraded,
        False if rolled_back is UNSET else bool(rolled_back),
        False if rollback_failed is UNSET else bool(rollback_failed),
        None if reason is UNSET else reason,
        None if body.lease is UNSET else _lease(body.lease),
    )


def _lease(lease: answers.Lease) -> LeaseGrant:
    return LeaseGrant(lease.id, lease.fencing, lease.ttl_ms, _given(lease.acquired_at_ms))


def parse_decision(data: dict[str, Any]) -> Decision:
    return _from_body(msgspec.convert(data, answers.Decision))


_DECISION = msgspec.json.Decoder(answers.Decision)
_BATCH = msgspec.json.Decoder(answers.BatchResult)


def decision_of(raw: bytes) -> Decision:
    """parse_decision straight from the JSON text (raises msgspec's errors)."""
    return _from_body(_DECISION.decode(raw))


def decisions_of(raw: bytes) -> list[Decision]:
    """parse_decisions straight from the JSON text (raises msgspec's errors)."""
    return _decisions(_BATCH.decode(raw))


def parse_decisions(data: dict[str, Any]) -> list[Decision]:
    """A batch's decisions; raises RequestIdReused when a check was refused for that."""
    return _decisions(msgspec.convert(data, answers.BatchResult))


def _decisions(batch: answers.BatchResult) -> list[Decision]:
    outcomes: list[Decision | RequestIdReused] = []
    for body in batch.results:
        if body.problem is UNSET:
            outcomes.append(_from_body(body))
        else:
            problem = msgspec.to_builtins(body.problem)
            if not is_reused(body.problem.status, problem):
                raise ValueError(f"a batch item refused: {body.problem.detail}")
            outcomes.append(RequestIdReused(body.problem.status, problem))
    return all_decisions(outcomes)


def parse_refund(data: dict[str, Any]) -> RefundResult:
    body = msgspec.convert(data, answers.RefundResult)
    return RefundResult(
        refunded=body.refunded,
        key=body.key,
        rule=body.rule,
        request_id=body.request_id,
        given_back=tuple(
            GivenBack(given.algorithm, given.count, _decimal(given.amount))
            for given in body.given_back
        ),
        detail=body.detail,
    )


def parse_quota_adjustment(data: dict[str, Any]) -> QuotaAdjustment:
    body = msgspec.convert(data, answers.QuotaAdjusted)
    return QuotaAdjustment(
        key=body.key,
        rule=body.rule,
        request_id=body.request_id,
        replayed=body.replayed,
        limit=body.limit,
        remaining=body.remaining,
        max_amount=_decimal(body.max_amount),
        amount_remaining=_decimal(body.amount_remaining),
    )


def parse_rule_info(data: dict[str, Any]) -> RuleInfo:
    return RuleInfo(
        name=str(data["name"]),
        limits=tuple(dict(limit) for limit in data["limits"]),
        on_failure=str(data["on_failure"]),
    )
