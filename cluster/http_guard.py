"""The web-middleware core shared by the ASGI and aiohttp middlewares.

One check per request through an `AsyncClient`, the client-side on_failure when the router
is unreachable, and the response headers (RateLimit / RateLimit-Policy, Retry-After and the
429 body) for the framework adapter to send.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import orjson

from cluster.client import AsyncClient, BadRequest, Decision, Unavailable
from cluster.failure import (
    UNREACHABLE_REASON,
    OnFailure,
    check_on_failure,
    unreachable_decision,
)
from cluster.ratelimit_headers import ratelimit_headers, rule_windows

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
            raise TypeError("the middlewares need a cluster.client.AsyncClient")
        self.client = client
        self.on_failure = check_on_failure(on_failure)
        self.cost = cost
        self._windows: dict[str, tuple[float, tuple[int, ...] | None]] = {}

    async def check(self, key: str, rule: str) -> Verdict:
        try:
            decision = await self.client.check(key, rule, cost=self.cost)
        except Unavailable as exc:
            decision = unreachable_decision(key, rule, self.on_failure, exc)
            return Verdict(decision, ratelimit_headers(decision, None))  # Retry-After only
        return Verdict(decision, ratelimit_headers(decision, await self._rule_windows(rule)))

    async def _rule_windows(self, rule: str) -> tuple[int, ...] | None:
        now = time.monotonic()
        cached = self._windows.get(rule)
        if cached is not None and now - cached[0] < RULE_TTL_S:
            return cached[1]
        try:
            windows = rule_windows(await self.client.rule(rule))
        except (Unavailable, BadRequest):
            return None  # no RateLimit-Policy this time; try again on the next request
        self._windows[rule] = (now, windows)
        return windows
