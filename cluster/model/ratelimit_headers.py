"""RateLimit-Policy / RateLimit / Retry-After header values: one implementation for the
router (`POST /v1/check`, `GET /v1/authz`) and the SDK's middlewares.

Fields per draft-ietf-httpapi-ratelimit-headers (the working group's latest text; the
syntax is that of -10): `RateLimit-Policy: "<rule>.<i>";q=<quota>;w=<window s>` and
`RateLimit: "<rule>.<i>";r=<remaining>;t=<s>`, where `t` is the number of seconds until
*additional* quota is made available for the policy: a fixed window's or calendar
period's reset; for a token or leaky bucket missing some quota, at most the interval of
one unit (`period / rate`), as a unit comes back that often; for sliding windows, the
time until the window holds no hit (quota may come back sooner, never later). Retry-After
(denials) is when the denied cost fits again: never earlier than `t` of the limit that
denied, except a sliding window's, whose `t` is only that bound. Amount-only calendar limits
(money) have no request quota and no fields.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from cluster.model.limits import LimitSpec

__all__ = ["HeaderPlan", "LimitState", "header_values", "retry_after_seconds", "window_seconds"]

_NOMINAL_PERIOD_S = {
    "minute": 60,
    "hour": 3600,
    "day": 86_400,
    "week": 604_800,
    "month": 2_592_000,
    "year": 31_536_000,
}


def window_seconds(spec: LimitSpec) -> int | None:
    """The policy window of one limit, in seconds; None for a quota or a concurrency
    limit (no window)."""
    if spec.algorithm in ("quota", "concurrency"):
        return None
    if spec.algorithm in ("fixed_window", "sliding_log", "sliding_window"):
        return max(1, math.ceil(spec.window_ms / 1000))
    if spec.algorithm in ("token_bucket", "leaky_bucket"):
        # Time for a drained bucket to fill (or a full queue to drain).
        return max(1, math.ceil((spec.limit or 0) * spec.window_ms / spec.rate / 1000))
    return _NOMINAL_PERIOD_S[spec.period]


def _more_quota_seconds(spec: LimitSpec | None, limit: int, remaining: int, reset_ms: int) -> int:
    reset_s = math.ceil(reset_ms / 1000)
    if (
        spec is not None
        and spec.algorithm in ("token_bucket", "leaky_bucket")
        and remaining < limit
        and spec.rate > 0
    ):
        return min(reset_s, max(1, math.ceil(spec.window_ms / spec.rate / 1000)))
    return reset_s


def retry_after_seconds(retry_after_ms: int) -> int:
    """Retry-After in whole seconds, rounded up, at least 1."""
    return max(1, math.ceil(retry_after_ms / 1000))


@dataclass(frozen=True, slots=True)
class LimitState:
    limit: int | None
    remaining: int | None
    reset_after_ms: int | None


def header_values(
    prefix: str,
    specs: Sequence[LimitSpec] | None,
    states: Sequence[LimitState],
    retry_after_ms: int | None,
) -> dict[str, str]:
    """The headers for one decision; `specs` (one per state) None when unknown: then no
    RateLimit-Policy, and `t` is each limit's reset. `retry_after_ms`: the decision's,
    None when allowed."""
    known = specs is not None and len(specs) == len(states)
    policies: list[str] = []
    fields: list[str] = []
    for index, state in enumerate(states):
        if state.limit is None:
            continue  # an amount-only calendar limit has no request quota
        spec = specs[index] if known and specs is not None else None
        name = f'"{prefix}.{index}"'
        if spec is not None:
            window = window_seconds(spec)
            policy = f"{name};q={state.limit}"
            policies.append(policy if window is None else f"{policy};w={window}")
        if state.remaining is not None and state.reset_after_ms is not None:
            t = _more_quota_seconds(spec, state.limit, state.remaining, state.reset_after_ms)
            fields.append(f"{name};r={state.remaining};t={t}")
    headers: dict[str, str] = {}
    if policies:
        headers["RateLimit-Policy"] = ", ".join(policies)
    if fields:
        headers["RateLimit"] = ", ".join(fields)
    if retry_after_ms is not None:
        headers["Retry-After"] = str(retry_after_seconds(retry_after_ms))
    return headers


class _Limited(Protocol):
    limit: int | None
    remaining: int | None
    reset_after_ms: int | None


class HeaderPlan:
    """header_values for one rule's limits, with every per-limit part that does not
    depend on the decision worked out once."""

    __slots__ = ("_buckets", "_names", "_policy", "_quotas", "_windows")

    def __init__(self, prefix: str, specs: Sequence[LimitSpec]) -> None:
        self._names = [f'"{prefix}.{index}"' for index in range(len(specs))]
        self._windows = []
        self._buckets: list[int | None] = []
        for spec in specs:
            window = window_seconds(spec)
            self._windows.append("" if window is None else f";w={window}")
            bucket = spec.algorithm in ("token_bucket", "leaky_bucket") and spec.rate > 0
            self._buckets.append(
                max(1, math.ceil(spec.window_ms / spec.rate / 1000)) if bucket else None
            )
        # The policy when the node reports each limit as configured (nearly always).
        self._quotas = [spec.limit for spec in specs]
        self._policy = self._policy_of(self._quotas)

    def _policy_of(self, limits: Sequence[int | None]) -> str:
        return ", ".join(
            f"{name};q={limit}{window}"
            for name, limit, window in zip(self._names, limits, self._windows, strict=True)
            if limit is not None
        )

    def values(self, states: Sequence[_Limited], retry_after_ms: int | None) -> dict[str, str]:
        """The same headers as header_values(prefix, specs, states, retry_after_ms)."""
        if len(states) != len(self._names):
            raise ValueError("one state per limit")
        if len(states) == 1:
            return self._one(states[0], retry_after_ms)
        limits = [state.limit for state in states]
        policy = self._policy if limits == self._quotas else self._policy_of(limits)
        fields: list[str] = []
        for name, unit_s, state in zip(self._names, self._buckets, states, strict=True):
            limit, remaining, reset_ms = state.limit, state.remaining, state.reset_after_ms
            if limit is None or remaining is None or reset_ms is None:
                continue
            t = math.ceil(reset_ms / 1000)
            if unit_s is not None and remaining < limit:
                t = min(t, unit_s)
            fields.append(f"{name};r={remaining};t={t}")
        headers: dict[str, str] = {}
        if policy:
            headers["RateLimit-Policy"] = policy
        if fields:
            headers["RateLimit"] = ", ".join(fields)
        if retry_after_ms is not None:
            headers["Retry-After"] = str(retry_after_seconds(retry_after_ms))
        return headers

    def _one(self, state: _Limited, retry_after_ms: int | None) -> dict[str, str]:
        """values() for a rule of one limit (nearly every rule), without the lists."""
        headers: dict[str, str] = {}
        limit, remaining, reset_ms = state.limit, state.remaining, state.reset_after_ms
        if limit is not None:
            policy = self._policy if limit == self._quotas[0] else self._policy_of([limit])
            headers["RateLimit-Policy"] = policy
            if remaining is not None and reset_ms is not None:
                t = math.ceil(reset_ms / 1000)
                unit_s = self._buckets[0]
                if unit_s is not None and remaining < limit:
                    t = min(t, unit_s)
                headers["RateLimit"] = f"{self._names[0]};r={remaining};t={t}"
        if retry_after_ms is not None:
            headers["Retry-After"] = str(retry_after_seconds(retry_after_ms))
        return headers
