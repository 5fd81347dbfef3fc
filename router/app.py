"""The router: the public HTTP API of shardlimit."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiohttp import web
from msgspec import UNSET
from prometheus_client import CONTENT_TYPE_LATEST

from cluster import wire
from cluster.model import answers
from cluster.model.errors import FieldError, Problems, ValidationError, did_you_mean
from cluster.model.limits import expired_quotas, format_amount
from cluster.web.problem import Problem, invalid, json_body, json_response, problem_middleware
from router.api.check_answers import (
    CHECK_BATCH_PATH,
    CHECK_PATH,
    MAX_BODY,
    JsonAnswer,
    batch_answer,
    check_answer,
)
from router.api.handler_tools import ROUTER, admin_only, query_of, router_of
from router.api.leases import RELEASE_PATH, RENEW_PATH, release_answer, renew_answer
from router.api.membership import abort_migration, add_node, remove_node, resume_migration
from router.api.openapi import openapi_document
from router.api.problems import problem_answers
from router.api.ring_view import RingView
from router.api.ui import HEADERS as UI_HEADERS
from router.api.ui import asset as ui_asset
from router.config import RouterConfig
from router.decide.answers import ratelimit_headers
from router.decide.quota_adjust import parse_adjust
from router.errors import NodeUnavailable, UnknownRule
from router.metrics import endpoint_of
from router.requests import (
    if_match,
    parse_authz,
    parse_check,
    parse_key,
    parse_refund,
    rule_name,
)
from router.rules.book import Rule, parse_rule, parse_rules_document
from router.rules.cluster_rules import RulesChange
from router.service import Router

__all__ = ["ENVOY", "ROUTER", "create_app"]

log = logging.getLogger("shardlimit.router")

# The Envoy rate-limit gRPC listener (router/envoy/servicer.py), present when grpc_port is set.
ENVOY: web.AppKey[Any] = web.AppKey("envoy")
# The layout behind GET /v1/cluster/ring, encoded once per topology epoch.
RING_VIEW: web.AppKey[RingView] = web.AppKey("ring_view")


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


def _etag(version: int) -> dict[str, str]:
    return {"ETag": f'"{version}"'}


async def _publish(request: web.Request, change: RulesChange, expected: int | None) -> int:
    """Apply `change` to the cluster's rules (the router's rules file is never written)."""
    version: int = await router_of(request).cluster_rules.publish(change, expected)
    return version


async def list_rules(request: web.Request) -> web.Response:
    book = router_of(request).rules
    listing = [rule.to_dict() for _, rule in sorted(book.rules.items())]
    answer = {"version": book.version, "rules": listing, "file": book.file_block()}
    return json_response(answer, headers=_etag(book.version))


@admin_only
async def put_rules(request: web.Request) -> web.Response:
    """Replace every rule at once (`shardlimit rules apply`)."""
    expected = if_match(request.headers)
    body = await json_body(request)
    if not isinstance(body, dict) or not isinstance(body.get("rules"), dict):
        raise invalid([FieldError("rules", "is required: an object of rules by name")])
    rules = parse_rules_document(body)
    problems = Problems()
    for name, rule in rules.items():
        expired_quotas(rule.limits, f"rules.{name}.limits", problems)
    problems.raise_if_any()
    version = await _publish(request, lambda _current: rules, expected)
    listing = [rule.to_dict() for _, rule in sorted(rules.items())]
    return json_response({"version": version, "rules": listing}, headers=_etag(version))


async def get_rule(request: web.Request) -> web.Response:
    name = rule_name(request.match_info["name"])
    book = router_of(request).rules
    rule = book.get(name)
    if rule is None:
        raise UnknownRule(name, did_you_mean(name, book.rules))
    return json_response(rule.to_dict(), headers=_etag(book.version))


@admin_only
async def put_rule(request: web.Request) -> web.Response:
    name = rule_name(request.match_info["name"])
    expected = if_match(request.headers)
    body = await json_body(request)
    problems = Problems()
    rule = problems.result(parse_rule(name, body, "body", problems))
    expired_quotas(rule.limits, "body.limits", problems)
    problems.raise_if_any()
    if isinstance(body, dict) and body.get("name") not in (None, name):
        raise invalid([FieldError("body.name", "must match the name in the path")])
    created = False

    def upsert(current: dict[str, Rule]) -> dict[str, Rule]:
        nonlocal created
        created = name not in current
        return {**current, name: rule}

    version = await _publish(request, upsert, expected)
    return json_response(rule.to_dict(), status=201 if created else 200, headers=_etag(version))


@admin_only
async def delete_rule(request: web.Request) -> web.Response:
    name = rule_name(request.match_info["name"])
    expected = if_match(request.headers)

    def remove(current: dict[str, Rule]) -> dict[str, Rule]:
        if name not in current:
            raise UnknownRule(name, did_you_mean(name, current))
        return {n: r for n, r in current.items() if n != name}

    version = await _publish(request, remove, expected)
    return web.Response(status=204, headers=_etag(version))


async def get_cluster(request: web.Request) -> web.Response:
    view = router_of(request).view
    stats = await view.node_stats()
    shares = view.topology.partitioner.shares()
    nodes: list[dict[str, Any]] = []
    specs = {n.id: n for n in (*view.previous_nodes(), *view.topology.nodes)}
    for spec in specs.values():
        client = view.clients[spec.id]
        node_stats = stats.get(spec.id, {})
        nodes.append(
            {
                "id": spec.id,
                "url": spec.url,
                "weight": spec.weight,
                "state": "down" if "error" in node_stats else client.state,
                "endpoints": client.endpoint_states(),
                "keys": node_stats.get("keys"),
                "memory_bytes": node_stats.get("memory"),
                "node_epoch": node_stats.get("epoch"),
                "redis": node_stats.get("replication"),
                "share": round(shares.get(spec.id, 0.0), 6),
                "ops_routed": client.ops,
                "node_requests": client.requests,
                "last_error": client.last_error,
            }
        )
    total_ops = sum(view.clients[spec_id].ops for spec_id in specs) or 1
    for node in nodes:
        node["load_share"] = round(view.clients[node["id"]].ops / total_ops, 6)
    return json_response(
        {
            "epoch": view.topology.epoch,
            "partitioner": view.topology.partitioner.kind,
            "nodes": nodes,
            "migration": router_of(request).resharder.status(),
        }
    )


async def get_cluster_ring(request: web.Request) -> web.Response:
    """Ring points or slot ranges of the current layout (router/api/ring_view.py), for /ui."""
    body = request.app[RING_VIEW].body(router_of(request).view.topology)
    return web.Response(body=body, content_type="application/json")


async def get_ui(request: web.Request) -> web.Response:
    """The live cluster page (router/api/ui/): /ui, and its files under /ui/."""
    if request.path == "/ui/":
        raise web.HTTPFound("/ui")
    found = ui_asset(request.match_info.get("name", "index.html"))
    if found is None:
        raise Problem(404, "not-found", f"no file {request.path}")
    body, content_type = found
    return web.Response(body=body, content_type=content_type, charset="utf-8", headers=UI_HEADERS)


async def get_locate(request: web.Request) -> web.Response:
    problems = Problems()
    key = parse_key(query_of(request).get("key"), "key", problems)
    problems.raise_if_any()
    located = router_of(request).view.topology.partitioner.locate(key)
    return json_response({"key": key, **located})


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    view = router_of(request).view

    async def probe(node_id: str) -> tuple[str, bool]:
        try:
            await view.clients[node_id].get("/readyz", timeout_s=0.5)
        except NodeUnavailable:
            return node_id, False
        return node_id, True

    states = dict(await asyncio.gather(*(probe(n) for n in view.clients)))
    down = sorted(n for n, ok in states.items() if not ok)
    body = {
        "status": "degraded" if down else "ready",
        "epoch": view.topology.epoch,
        "nodes": {n: ("up" if ok else "down") for n, ok in sorted(states.items())},
    }
    return json_response(body, status=503 if down else 200)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus exposition; no token, like /healthz: no label carries a limit key."""
    return web.Response(
        body=router_of(request).render_metrics(),
        headers={"Content-Type": CONTENT_TYPE_LATEST, "X-Content-Type-Options": "nosniff"},
    )


async def get_openapi(request: web.Request) -> web.Response:
    return json_response(openapi_document())


@web.middleware
async def observe(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every request's latency by endpoint, and its status if it is a problem."""
    started = time.perf_counter()
    response: web.StreamResponse = await handler(request)
    elapsed = time.perf_counter() - started
    request.app[ROUTER].metrics.responded(endpoint_of(request), response.status, elapsed)
    return response


def create_app(
    config: RouterConfig, admin_token: str | None, cluster_token: str | None
) -> web.Application:
    app = web.Application(
        client_max_size=MAX_BODY, middlewares=[observe, problem_middleware, problem_answers]
    )
    router = Router(config, admin_token, cluster_token)
    app[ROUTER] = router
    app[RING_VIEW] = RingView()
    app.router.add_post(CHECK_PATH, post_check)
    app.router.add_post(CHECK_BATCH_PATH, post_batch)
    app.router.add_post("/v1/refund", post_refund)
    app.router.add_post("/v1/quota/adjust", post_quota_adjust)
    app.router.add_post(RENEW_PATH, post_lease_renew)
    app.router.add_post(RELEASE_PATH, post_lease_release)
    app.router.add_get("/v1/usage", get_usage)
    app.router.add_get("/v1/authz", get_authz)
    app.router.add_get("/v1/rules", list_rules)
    app.router.add_put("/v1/rules", put_rules)
    app.router.add_get("/v1/rules/{name}", get_rule)
    app.router.add_put("/v1/rules/{name}", put_rule)
    app.router.add_delete("/v1/rules/{name}", delete_rule)
    app.router.add_get("/v1/cluster", get_cluster)
    app.router.add_get("/v1/cluster/ring", get_cluster_ring)
    app.router.add_post("/v1/cluster/nodes", add_node)
    app.router.add_delete("/v1/cluster/nodes/{id}", remove_node)
    app.router.add_post("/v1/cluster/migration/resume", resume_migration)
    app.router.add_post("/v1/cluster/migration/abort", abort_migration)
    app.router.add_get("/v1/locate", get_locate)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", get_openapi)
    app.router.add_get("/ui", get_ui)
    app.router.add_get("/ui/", get_ui)
    app.router.add_get("/ui/{name}", get_ui)

    async def on_startup(app: web.Application) -> None:
        try:
            await app[ROUTER].start()
        except ValidationError as exc:
            raise SystemExit(f"rules file rejected: {exc}") from exc

    async def on_cleanup(app: web.Application) -> None:
        await app[ROUTER].stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    if config.grpc_port is not None:
        try:
            from router.envoy.servicer import EnvoyListener  # grpcio is loaded only when it is on
        except ImportError as exc:
            raise SystemExit(
                f"grpc_port needs the envoy extra (pip install 'shardlimit[envoy]'): {exc}"
            ) from exc

        envoy = EnvoyListener(router)
        app[ENVOY] = envoy

        async def start_envoy(_app: web.Application) -> None:
            await envoy.start()

        async def stop_envoy(_app: web.Application) -> None:
            await envoy.stop()  # on shutdown: before the router's cleanup

        app.on_startup.append(start_envoy)
        app.on_shutdown.append(stop_envoy)
    return app
