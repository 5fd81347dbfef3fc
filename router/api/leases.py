"""Handlers of a concurrency limit's leases: POST /v1/lease/renew and /v1/lease/release
(router/decide/leases.py)."""

from __future__ import annotations

from aiohttp import web

from cluster.model.errors import Problems
from cluster.web.problem import json_body, json_response
from router.api.handler_tools import router_of
from router.decide.leases import Action, parse_lease

RENEW_PATH = "/v1/lease/renew"
RELEASE_PATH = "/v1/lease/release"


async def _lease(request: web.Request, action: Action) -> web.Response:
    router = router_of(request)
    body = await json_body(request)
    problems = Problems()
    parsed = problems.result(parse_lease(action, body, router.rules, problems))
    return json_response(await router.lease(parsed))


async def post_lease_renew(request: web.Request) -> web.Response:
    """200 with the lease's new ttl_ms; 404 lease-not-found when it is no longer held."""
    return await _lease(request, "renew")


async def post_lease_release(request: web.Request) -> web.Response:
    """200 once the lease is released; 404 lease-not-found when it was not held."""
    return await _lease(request, "release")
