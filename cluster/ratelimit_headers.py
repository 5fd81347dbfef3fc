"""RateLimit-Policy / RateLimit / Retry-After headers from an SDK `Decision`.

The same values as the router's `router.decisions.ratelimit_headers` on `POST /v1/check`
(draft-ietf-httpapi-ratelimit-headers-10). The window of each limit (`w=`) is not part of a
decision, so it comes from the rule's definition (`Client.rule`). `window_seconds` is a copy
of the router's `_window_seconds`: the SDK does not import `router/`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cluster.client import Decision, RuleInfo
from cluster.errors import Problems
from cluster.limits import LimitSpec, parse_limits

_NOMINAL_PERIOD_S = {
    "minute": 60,
    "hour": 3600,
    "day": 86_400,
    "week": 604_800,
    "month": 2_592_000,
    "year": 31_536_000,
}


def window_seconds(spec: LimitSpec) -> int:
    """The policy window of one limit, in seconds (copied from router/decisions.py)."""
    if spec.algorithm in ("fixed_window", "sliding_log", "sliding_window"):
        return max(1, math.ceil(spec.window_ms / 1000))
    if spec.algorithm in ("token_bucket", "leaky_bucket"):
        # Time for a drained bucket to fill (or a full queue to drain).
        return max(1, math.ceil((spec.limit or 0) * spec.window_ms / spec.rate / 1000))
    return _NOMINAL_PERIOD_S[spec.period]


def rule_windows(info: RuleInfo) -> tuple[int, ...] | None:
    """Each limit's window in seconds, or None if the definition cannot be read."""
    problems = Problems()
    specs = parse_limits(list(info.limits), "limits", problems)
    if problems.errors:
        return None
    return tuple(window_seconds(spec) for spec in specs)


def retry_after_seconds(retry_after_ms: int) -> int:
    """Retry-After in whole seconds, rounded up, at least 1."""
    return max(1, math.ceil(retry_after_ms / 1000))


def ratelimit_headers(decision: Decision, windows: Sequence[int] | None) -> dict[str, str]:
    """The router's headers for this decision; no policy when `windows` is unknown."""
    policies: list[str] = []
    states: list[str] = []
    prefix = decision.rule or "inline"
    known = windows is not None and len(windows) == len(decision.limits)
    for index, view in enumerate(decision.limits):
        if view.limit is None:
            continue  # an amount-only calendar limit has no request quota
        name = f'"{prefix}.{index}"'
        if known and windows is not None:
            policies.append(f"{name};q={view.limit};w={windows[index]}")
        if view.remaining is not None and view.reset_after_ms is not None:
            states.append(f"{name};r={view.remaining};t={math.ceil(view.reset_after_ms / 1000)}")
    headers: dict[str, str] = {}
    if policies:
        headers["RateLimit-Policy"] = ", ".join(policies)
    if states:
        headers["RateLimit"] = ", ".join(states)
    if not decision.allowed and decision.retry_after_ms is not None:
        headers["Retry-After"] = str(retry_after_seconds(decision.retry_after_ms))
    return headers
