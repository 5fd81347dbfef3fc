"""Domain errors -> HTTP, in one table (as httpx maps transport errors in one place).

Handlers and the modules under them raise their own exceptions, or `Problem` where
the answer is specific to one endpoint; `problem_answers` is the only place that
turns an exception into a status and a problem type (for the aiohttp handlers through the
middleware, for router/front/server.py through `problem_of`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from cluster.model.errors import FieldError, ValidationError
from cluster.web.problem import Problem, invalid
from router.errors import (
    AdjustRefused,
    LeaseNotFound,
    NodeUnavailable,
    PreconditionFailed,
    ReshardError,
    RulesConflict,
    RulesUnavailable,
    UnknownRule,
)


def _rules_conflict(exc: RulesConflict) -> Problem:
    return Problem(
        409,
        "version-conflict",
        f"{exc}: read them again (GET /v1/rules) and retry",
        headers={"ETag": f'"{exc.current}"'},
    )


def _adjust_refused(exc: AdjustRefused) -> Problem:
    return Problem(502 if exc.kind == "error" else 409, exc.kind, str(exc))


def _validation(exc: ValidationError) -> Problem:
    return invalid(exc.errors or [FieldError("body", str(exc))])


def _node_unavailable(exc: NodeUnavailable) -> Problem:
    return Problem(503, "node-unavailable", f"the key's node is unavailable: {exc}")


def _rules_unavailable(exc: RulesUnavailable) -> Problem:
    return Problem(503, "rules-not-saved", f"the cluster could not store the rules: {exc}")


# The first class that matches answers.
PROBLEMS: list[tuple[type[Exception], Callable[[Any], Problem]]] = [
    (NodeUnavailable, _node_unavailable),
    (RulesConflict, _rules_conflict),
    (PreconditionFailed, lambda exc: Problem(412, "precondition-failed", str(exc))),
    (RulesUnavailable, _rules_unavailable),
    (UnknownRule, lambda exc: Problem(404, "unknown-rule", f"no rule named '{exc}'{exc.hint}")),
    (AdjustRefused, _adjust_refused),
    (LeaseNotFound, lambda exc: Problem(404, "lease-not-found", str(exc))),
    (ReshardError, lambda exc: Problem(503 if exc.unavailable else 409, exc.slug, str(exc))),
    (ValidationError, _validation),
]


def as_problem(exc: Exception) -> Problem | None:
    """The answer to a domain error; None for anything else."""
    for kind, translate in PROBLEMS:
        if isinstance(exc, kind):
            return translate(exc)
    return None


def problem_of(exc: Exception) -> Problem | None:
    """The answer to anything a handler raises: a Problem is its own, a domain error is
    translated; None for anything else (a bug: the caller logs it and answers 500)."""
    return exc if isinstance(exc, Problem) else as_problem(exc)


@web.middleware
async def problem_answers(request: web.Request, handler: Any) -> web.StreamResponse:
    """Answer a Problem or a domain error raised by a handler with its problem+json."""
    try:
        response: web.StreamResponse = await handler(request)
    except Exception as exc:
        translated = problem_of(exc)
        if translated is None:
            raise
        return translated.response()
    return response
