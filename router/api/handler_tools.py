"""What every router handler uses: the Router behind the app and the admin-token guard
(JSON answers: cluster.web.problem.json_response, shared with the nodes)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import parse_qsl

from aiohttp import web

from cluster.model.errors import FieldError
from cluster.web.auth import bearer_check
from cluster.web.problem import Problem, invalid
from router.service import Router

ROUTER: web.AppKey[Router] = web.AppKey("router")

Handler = Callable[[web.Request], Awaitable[web.Response]]


def router_of(request: web.Request) -> Router:
    return request.app[ROUTER]


def query_of(request: web.Request) -> Mapping[str, str]:
    """The request's query; a 400 when a percent-escape is not UTF-8. aiohttp reads such
    an escape as U+FFFD, so `?key=%FF` and `?key=%FE` would count on one counter."""
    raw = request.rel_url.raw_query_string
    if "%" in raw:
        try:
            parse_qsl(raw, keep_blank_values=True, errors="strict")
        except UnicodeDecodeError:
            raise invalid([FieldError("query", "a percent-escape is not UTF-8")]) from None
    return request.query


_FLAGS = {"1": True, "true": True, "0": False, "false": False}


def query_flag(request: web.Request, name: str) -> bool:
    """A true/false query parameter (absent: false). Any other value is a 400: a typo
    such as `dry_run=yes` must not read as false and do the real thing."""
    value = query_of(request).get(name)
    if value is None:
        return False
    if value not in _FLAGS:
        raise invalid([FieldError(name, f"must be 1, true, 0 or false, not {value!r}")])
    return _FLAGS[value]


def need_admin(why: str = "missing") -> Problem:
    """The 401 of an admin endpoint: `why` is "missing" (no bearer token) or "wrong"."""
    detail = (
        "the admin token given is not this cluster's"
        if why == "wrong"
        else "this endpoint needs the admin token: Authorization: Bearer <token>"
    )
    return Problem(
        401,
        "unauthorized",
        detail,
        headers={"WWW-Authenticate": 'Bearer realm="shardlimit-admin"'},
    )


def admin_check(request: web.Request) -> str:
    """ "ok", "missing" or "wrong": the request's admin token (cluster.web.auth.bearer_check)."""
    return bearer_check(request.headers.get("Authorization"), router_of(request).admin_token)


def admin_only(handler: Handler) -> Handler:
    """A handler that needs the admin token (a 401 problem without it, or with another)."""

    @functools.wraps(handler)
    async def guarded(request: web.Request) -> web.Response:
        why = admin_check(request)
        if why != "ok":
            raise need_admin(why)
        return await handler(request)

    return guarded
