"""The web-middleware core shared by the ASGI and aiohttp middlewares.

One check per request through an `AsyncClient`, the client-side on_failure when the router
is unreachable, and the response headers (RateLimit / RateLimit-Policy, Retry-After and the
429 body) for the framework adapter to send.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from cluster.model.errors import Problems
from cluster.model.limits import LimitSpec, parse_limits
from cluster.model.ratelimit_headers import LimitState, header_values
from cluster.sdk.client import AsyncClient, BadRequest, Decision, RuleInfo, Unavailable
from cluster.sdk.failure import (
    UNREACHABLE_REASON,
    OnFailure,
    check_on_failure,
    unreachable_decision,
)

PROBLEM_TYPE = "https://shardlimit.dev/problems/rate-limited"
# Rule definitions (for the policy windows) are read again after this many seconds.
RULE_TTL_S = 60.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with one request."""

    decision: Decision
    headers: dict[str, str]

    @property
    def allowed(self) -> bool:
        return self.decision.allowed

    def _detail(self) -> str:
        if self.decision.degraded_reason == UNREACHABLE_REASON:
            return "the rate-limit service is unreachable and on_failure is 'deny'"
        return f"rate limit of rule '{self.decision.rule}' exceeded"

    def denied_body(self) -> bytes:
        """An RFC 9457 problem for the 429."""
        return orjson.dumps(
            {
                "type": PROBLEM_TYPE,
                "title": "Too Many Requests",
                "status": 429,
                "detail": self._detail(),
                "retry_after_ms": self.decision.retry_after_ms,
            }
        )


class HttpGuard:
    """Checks `key` against `rule` and says what headers the response carries."""

    def __init__(
        self, client: AsyncClient, on_failure: OnFailure | None = None, *, cost: int = 1
    ) -> None:
        if not isinstance(client, AsyncClient):
            raise TypeError("the middlewares need a cluster.sdk.client.AsyncClient")
        self.client = client
        self.on_failure = check_on_failure(on_failure)
        self.cost = cost
        self._specs: dict[str, tuple[float, tuple[LimitSpec, ...] | None]] = {}

    async def check(self, key: str, rule: str) -> Verdict:
        try:
            decision = await self.client.check(key, rule, cost=self.cost)
        except Unavailable as exc:
            decision = unreachable_decision(key, rule, self.on_failure, exc)
            return Verdict(decision, ratelimit_headers(decision, None))  # Retry-After only
        return Verdict(decision, ratelimit_headers(decision, await self._rule_specs(rule)))

    async def _rule_specs(self, rule: str) -> tuple[LimitSpec, ...] | None:
        now = time.monotonic()
        cached = self._specs.get(rule)
        if cached is not None and now - cached[0] < RULE_TTL_S:
            return cached[1]
        try:
            specs = rule_specs(await self.client.rule(rule))
        except (Unavailable, BadRequest):
            return None  # no RateLimit-Policy this time; try again on the next request
        self._specs[rule] = (now, specs)
        return specs


def rule_specs(info: RuleInfo) -> tuple[LimitSpec, ...] | None:
    """A rule's limits as read from the router, or None if they cannot be read here."""
    problems = Problems()
    specs = parse_limits(list(info.limits), "limits", problems)
    return None if problems.errors else specs


def ratelimit_headers(decision: Decision, specs: Sequence[LimitSpec] | None) -> dict[str, str]:
    """The router's headers for an SDK decision (`specs`: the rule's, `rule_specs`)."""
    states = [LimitState(v.limit, v.remaining, v.reset_after_ms) for v in decision.limits]
    retry = None if decision.allowed else decision.retry_after_ms
    return header_values(decision.rule or "inline", specs, states, retry)
