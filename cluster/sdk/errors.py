"""The errors the SDK raises: one base class, 4xx problems, and Unavailable."""

from __future__ import annotations

from typing import Any

from cluster.sdk.decisions import Decision


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


class Unavailable(ShardlimitError):
    """The router could not answer: 5xx, connection refused, timeout, broken response."""

    def __init__(self, message: str, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)
