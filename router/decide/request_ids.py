"""A request_id names one request: the answer when it is reused for another.

A check's first decision is recorded on its node with the request's fingerprint (rule
or inline limits, cost, amount: cluster/model/keys.py). A later check with the same
key, scope and request_id replays that decision only when it carries the same
fingerprint; any other is refused with nothing consumed (node/store/lua/batch.lua). The
router answers it as a 409 problem `request-id-reused`: the whole answer of
`POST /v1/check`, or, in a batch, that item alone (a decision not admitted, carrying
the problem; the others proceed, and an all-or-nothing batch is then not admitted).
"""

from __future__ import annotations

from msgspec import UNSET

from cluster.model import answers
from cluster.web.problem import PROBLEM_TYPE, Problem
from router.requests import CheckRequest

SLUG = "request-id-reused"
STATUS = 409


def reused_decision(
    request: CheckRequest, node: str, detail: str | None = None
) -> answers.Decision:
    """The answer to a check whose request_id was first used for another request."""
    detail = detail or (
        f"request_id {request.request_id!r} was first used for key {request.key!r} with "
        "other parameters (cost, amount or inline limits): a request_id names one request "
        "of a key and rule; nothing was consumed"
    )
    problem = answers.ItemProblem(
        type=PROBLEM_TYPE + SLUG, title="Conflict", status=STATUS, detail=detail
    )
    return answers.Decision(
        allowed=False,
        key=request.key,
        rule=request.rule.public_name,
        node=node,
        retry_after_ms=None,
        limits=[],
        denied_by=[],
        dry_run=request.dry_run,
        problem=problem,
    )


def raise_if_refused(decision: answers.Decision) -> None:
    """`POST /v1/check`: a refused check is answered with its problem. Raises Problem."""
    if decision.problem is not UNSET:
        raise Problem(decision.problem.status, SLUG, decision.problem.detail)
