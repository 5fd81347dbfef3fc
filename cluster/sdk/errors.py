"""The errors the SDK raises: one base class, 4xx problems, and Unavailable."""

from __future__ import annotations

from typing import Any


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


class Unavailable(ShardlimitError):
    """The router could not answer: 5xx, connection refused, timeout, broken response."""

    def __init__(self, message: str, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)
