"""The decision endpoints on aiohttp: checks and batches (the lean front answers most of
them first: router/front/), lease renewals and releases, refunds, quota adjustments,
usage, and forward auth for gateways."""

from __future__ import annotations

from aiohttp import web
from msgspec import UNSET

from cluster import wire
from cluster.model import answers
from cluster.model.errors import Problems
from cluster.model.limits import format_amount
from cluster.web.problem import Problem, json_body, json_response
from router.api.authz_query import parse_authz
from router.api.check_answers import JsonAnswer, batch_answer, check_answer
from router.api.handler_tools import admin_only, query_of, router_of
from router.api.leases import release_answer, renew_answer
from router.decide.answers import ratelimit_headers
from router.decide.quota_adjust import parse_adjust
from router.requests import parse_check, parse_refund


def _json(answer: JsonAnswer) -> web.Response:
    return web.Response(
        body=answer.body,
        status=answer.status,
        content_type="application/json",
        headers=answer.headers,
    )


async def post_check(request: web.Request) -> web.Response:
    return _json(await check_answer(router_of(request), await request.read()))


async def post_batch(request: web.Request) -> web.Response:
    return _json(await batch_answer(router_of(request), await request.read()))


async def post_lease_renew(request: web.Request) -> web.Response:
    """200 with the lease's new ttl_ms; 404 lease-not-found when it is no longer held."""
    return _json(await renew_answer(router_of(request), await request.read()))


async def post_lease_release(request: web.Request) -> web.Response:
    """200 once the lease is released; 404 lease-not-found when it was not held."""
    return _json(await release_answer(router_of(request), await request.read()))


async def post_refund(request: web.Request) -> web.Response:
    router = router_of(request)
    body = await json_body(request)
    problems = Problems()
    parsed = problems.result(parse_refund(body, router.rules, problems))
    result = await router.refund(parsed)
    status = result.status
    if status == wire.RefundStatus.UNKNOWN:
        raise Problem(
            404,
            "unknown-decision",
            "no decision with this key, rule and request_id "
            "(never made, or its idempotency record expired)",
        )
    if status == wire.RefundStatus.ALREADY_REFUNDED:
        raise Problem(409, "already-refunded", "this decision was already refunded")
    if status == wire.RefundStatus.OTHER_COUNTERS:
        raise Problem(
            409,
            "refund-mismatch",
            "this decision consumed from other limits than the ones given (inline limits "
            "unlike the check's, or a rule whose every window changed since): nothing was "
            "given back, and the decision can still be refunded with the check's limits",
        )
    refunded = status == wire.RefundStatus.REFUNDED
    given = []
    if refunded:
        for spec, (count, amount) in zip(parsed.rule.limits, result.given, strict=True):
            shows_amount = spec.algorithm == "calendar" or spec.max_amount is not None
            money = format_amount(amount, spec.amount_scale) if shows_amount else UNSET
            given.append(answers.GivenBack(algorithm=spec.algorithm, count=count, amount=money))
    return json_response(
        answers.RefundResult(
            refunded=refunded,
            key=parsed.key,
            rule=parsed.rule.public_name,
            request_id=parsed.request_id,
            given_back=given,
            detail=None if refunded else "the decision consumed nothing",
        )
    )


@admin_only
async def post_quota_adjust(request: web.Request) -> web.Response:
    """Restock a quota counter or set what it has left (router/decide/quota_adjust.py)."""
    router = router_of(request)
    body = await json_body(request)
    problems = Problems()
    parsed = problems.result(parse_adjust(body, router.rules, problems))
    return json_response(await router.adjust_quota(parsed))


async def get_usage(request: web.Request) -> web.Response:
    router = router_of(request)
    problems = Problems()
    query = query_of(request)
    body = {
        "key": query.get("key"),
        "rule": query.get("rule"),
        "cost": 0,
        "dry_run": True,
    }
    parsed = problems.result(parse_check(body, router.rules, problems))
    return json_response(await router.check(parsed))


async def get_authz(request: web.Request) -> web.Response:
    """Forward auth for gateways (nginx auth_request, Caddy forward_auth, HAProxy):
    204 allowed, `deny_status` (429, or 403 for nginx) denied, with the RateLimit
    headers either way and Retry-After when denied. No body: gateways drop it."""
    router = router_of(request)
    problems = Problems()
    query = query_of(request)
    parsed = problems.result(parse_authz(query, request.headers, router.rules, problems))
    result = await router.check(parsed.check)
    headers = ratelimit_headers(parsed.check, result)
    if result.degraded:
        headers["X-Shardlimit-Degraded"] = str(result.degraded_reason or "true")
    return web.Response(status=204 if result.allowed else parsed.deny_status, headers=headers)
