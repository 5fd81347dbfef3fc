"""The errors the SDK raises: one base class, 4xx problems, and Unavailable."""

from __future__ import annotations

from typing import Any

from cluster.sdk.decisions import Decision, LimitState


class ShardlimitError(Exception):
    """Base class of every error raised by this client."""


class BadRequest(ShardlimitError):
    """The router refused the request (4xx problem+json)."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        raw = problem.get("errors")
        self.errors: list[tuple[str, str]] = [
            (str(e.get("field")), str(e.get("message")))
            for e in (raw if isinstance(raw, list) else [])
            if isinstance(e, dict)
        ]
        title = problem.get("title") or "Error"
        detail = problem.get("detail")
        super().__init__(f"{status} {title}: {detail}" if detail else f"{status} {title}")


class NotFound(BadRequest):
    """404: unknown decision (refund), rule or path."""


class LeaseNotHeld(NotFound):
    """404 lease-not-found: a renewal or release named a lease that is no longer held
    (it expired, was released, or never existed)."""


class LeaseLost(ShardlimitError):
    """A lease held by `client.lease(...)` was lost before its body finished: a renewal
    found it no longer held, or no renewal got through before it ran out. The body may
    have run without the lease; `fencing` protects what it wrote."""

    def __init__(self, lease_id: str, fencing: int, why: str) -> None:
        self.lease_id = lease_id
        self.fencing = fencing
        super().__init__(f"lease {lease_id} (fencing {fencing}) lost: {why}")


class AlreadyRefunded(BadRequest):
    """409: the decision was already refunded."""


class RequestIdReused(BadRequest):
    """409: the request_id was first used for a different request (another rule or
    limits, cost or amount under the same key); nothing was consumed. A request_id
    replays only the request it was first used for.

    From `check_many`: the first reused check's `index`, and in `results` every
    check's outcome in order, its Decision or a RequestIdReused."""

    index: int | None = None
    results: tuple[Decision | RequestIdReused, ...] = ()


REUSED_TYPE_SUFFIX = "/request-id-reused"


def is_reused(status: int, problem: dict[str, Any]) -> bool:
    return status == 409 and str(problem.get("type", "")).endswith(REUSED_TYPE_SUFFIX)


def all_decisions(outcomes: list[Decision | RequestIdReused]) -> list[Decision]:
    """The decisions, or RequestIdReused (the first, carrying every outcome)."""
    for index, outcome in enumerate(outcomes):
        if isinstance(outcome, RequestIdReused):
            outcome.index, outcome.results = index, tuple(outcomes)
            raise outcome
    return [outcome for outcome in outcomes if not isinstance(outcome, RequestIdReused)]


def outcomes_of(error: RequestIdReused, size: int) -> list[Decision | RequestIdReused]:
    """Every check's outcome a batch's RequestIdReused carries."""
    return list(error.results) if len(error.results) == size else [error] * size


class RateLimited(ShardlimitError):
    """A `@limited` call was denied, or `client.lease(...)` found no free slot; carries
    the router's decision."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        retry = decision.retry_after_ms
        after = f"; retry after {retry} ms" if retry is not None else ""
        super().__init__(f"rate limited: key {decision.key!r} under rule {decision.rule!r}{after}")

    @property
    def allowed(self) -> bool:
        return self.decision.allowed

    @property
    def retry_after_ms(self) -> int | None:
        return self.decision.retry_after_ms

    @property
    def limits(self) -> tuple[LimitState, ...]:
        return self.decision.limits

    @property
    def key(self) -> str:
        return self.decision.key

    @property
    def rule(self) -> str | None:
        return self.decision.rule


class Unavailable(ShardlimitError):
    """The router could not answer: 5xx, connection refused, timeout, broken response."""

    def __init__(self, message: str, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)
