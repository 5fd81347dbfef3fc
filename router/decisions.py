"""Node results -> the public decision body and RateLimit headers."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from cluster.algorithms import BY_NAME, NONE
from cluster.limits import LimitSpec, format_amount
from cluster.wire import Checked, LimitRow
from router.requests import CheckRequest

_NOMINAL_PERIOD_S = {
    "minute": 60,
    "hour": 3600,
    "day": 86_400,
    "week": 604_800,
    "month": 2_592_000,
    "year": 31_536_000,
}


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
}


def _limit_view(spec: LimitSpec, row: LimitRow) -> dict[str, Any]:
    view: dict[str, Any] = {
        "algorithm": spec.algorithm,
        "limit": _opt(row.limit),
        "remaining": _opt(row.remaining),
        "reset_after_ms": row.reset_after_ms,
    }
    for name in BY_NAME[spec.algorithm].view_fields:
        view[name] = _VIEW_FIELDS[name](spec, row)
    return view


def decision(request: CheckRequest, node: str, result: Checked) -> dict[str, Any]:
    rows = result.limits
    allowed = result.allowed
    denied_by = [i for i, row in enumerate(rows) if row.ok == 0]
    retry: int | None = None
    if not allowed:
        waits = [rows[i].retry_after_ms for i in denied_by]
        # A cost that can never fit has no retry time.
        retry = None if not waits or NONE in waits else max(waits)
    return {
        "allowed": allowed,
        "key": request.key,
        "rule": request.rule.public_name,
        "node": node,
        "retry_after_ms": retry,
        "limits": [_limit_view(s, r) for s, r in zip(request.rule.limits, rows, strict=True)],
        "denied_by": denied_by if not allowed else [],
        "replayed": result.replayed,
        "dry_run": request.dry_run,
        "degraded": False,
    }


def degraded_decision(request: CheckRequest, node: str, reason: str) -> dict[str, Any]:
    """A node could not answer in time: apply the rule's on_failure."""
    allowed = request.rule.on_failure == "allow"
    limits = []
    for spec in request.rule.limits:
        view: dict[str, Any] = {
            "algorithm": spec.algorithm,
            "limit": spec.limit,
            "remaining": None,
            "reset_after_ms": None,
        }
        limits.append(view)
    return {
        "allowed": allowed,
        "key": request.key,
        "rule": request.rule.public_name,
        "node": node,
        "retry_after_ms": None if allowed else 1000,
        "limits": limits,
        "denied_by": [] if allowed else list(range(len(limits))),
        "replayed": False,
        "dry_run": request.dry_run,
        "degraded": True,
        "degraded_reason": reason,
    }


def _window_seconds(spec: LimitSpec) -> int:
    if spec.algorithm in ("fixed_window", "sliding_log", "sliding_window"):
        return max(1, math.ceil(spec.window_ms / 1000))
    if spec.algorithm in ("token_bucket", "leaky_bucket"):
        # Time for a drained bucket to fill (or a full queue to drain).
        return max(1, math.ceil((spec.limit or 0) * spec.window_ms / spec.rate / 1000))
    return _NOMINAL_PERIOD_S[spec.period]


def ratelimit_headers(request: CheckRequest, body: dict[str, Any]) -> dict[str, str]:
    """RateLimit-Policy / RateLimit (draft-ietf-httpapi-ratelimit-headers-10) + Retry-After."""
    policies: list[str] = []
    states: list[str] = []
    prefix = request.rule.public_name or "inline"
    for index, (spec, view) in enumerate(zip(request.rule.limits, body["limits"], strict=True)):
        if view["limit"] is None:
            continue  # an amount-only calendar limit has no request quota
        name = f'"{prefix}.{index}"'
        policies.append(f"{name};q={view['limit']};w={_window_seconds(spec)}")
        if view["remaining"] is not None and view["reset_after_ms"] is not None:
            reset_s = math.ceil(view["reset_after_ms"] / 1000)
            states.append(f"{name};r={view['remaining']};t={reset_s}")
    headers: dict[str, str] = {}
    if policies:
        headers["RateLimit-Policy"] = ", ".join(policies)
    if states:
        headers["RateLimit"] = ", ".join(states)
    if not body["allowed"] and body["retry_after_ms"] is not None:
        headers["Retry-After"] = str(max(1, math.ceil(body["retry_after_ms"] / 1000)))
    return headers
