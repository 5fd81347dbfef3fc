"""The router: the public HTTP API of shardlimit."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from cluster import wire
from cluster.model.errors import FieldError, Problems, ValidationError
from cluster.model.keys import RULE_NAME
from cluster.model.limits import expired_quotas, format_amount
from cluster.model.nodes import NodeSpec
from cluster.web.auth import bearer_matches
from cluster.web.problem import problem, problem_middleware, read_json
from router.cluster_rules import Change, RulesConflict, RulesUnavailable, UnknownRule
from router.cluster_view import ClusterView
from router.config import RouterConfig
from router.decisions import ReplayMismatch, ratelimit_headers
from router.dispatch import NodeUnavailable
from router.metrics import endpoint_of
from router.openapi import openapi_document
from router.quota_adjust import AdjustRefused, parse_adjust
from router.requests import (
    IF_MATCH,
    parse_authz,
    parse_batch,
    parse_check,
    parse_key,
    parse_refund,
)
from router.resharding import ReshardError
from router.ring_view import RingView
from router.rules import Rule, parse_rule, parse_rules_document
from router.service import Router
from router.ui import HEADERS as UI_HEADERS
from router.ui import asset as ui_asset

log = logging.getLogger("shardlimit.router")
MAX_BODY = 1024 * 1024

ROUTER: web.AppKey[Router] = web.AppKey("router")
# The Envoy rate-limit gRPC listener (router/envoy.py), present when grpc_port is set.
ENVOY: web.AppKey[Any] = web.AppKey("envoy")
# The layout behind GET /v1/cluster/ring, encoded once per topology epoch.
RING_VIEW: web.AppKey[RingView] = web.AppKey("ring_view")


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(data), status=status, content_type="application/json", headers=headers
    )


def _invalid(errors: list[FieldError]) -> web.Response:
    detail = "; ".join(f"{e.path}: {e.message}" for e in errors[:5])
    return problem(400, "validation", detail, errors)


def _router(request: web.Request) -> Router:
    return request.app[ROUTER]


Handler = Callable[[web.Request], Awaitable[web.Response]]


def _is_admin(request: web.Request) -> bool:
    return bearer_matches(request.headers.get("Authorization"), _router(request).admin_token)


def admin_only(handler: Handler) -> Handler:
    """A handler that needs the admin token (a 401 problem without it)."""

    @functools.wraps(handler)
    async def guarded(request: web.Request) -> web.Response:
        if not _is_admin(request):
            return _need_admin()
        return await handler(request)

    return guarded


def _need_admin() -> web.Response:
    return problem(
        401,
        "unauthorized",
        "this endpoint needs the admin token: Authorization: Bearer <token>",
        headers={"WWW-Authenticate": 'Bearer realm="shardlimit-admin"'},
    )


async def post_check(request: web.Request) -> web.Response:
    router = _router(request)
    body, error = await read_json(request)
    if error is not None:
        return error
    problems = Problems()
    parsed = parse_check(body, router.rules, problems)
    if parsed is None:
        return _invalid(problems.errors)
    result = await router.check(parsed)
    status = 200 if result["allowed"] else 429
    return _json(result, status, ratelimit_headers(parsed, result))


async def post_batch(request: web.Request) -> web.Response:
    router = _router(request)
    body, error = await read_json(request)
    if error is not None:
        return error
    problems = Problems()
    checks, all_or_nothing = parse_batch(body, router.rules, problems)
    if problems.errors:
        return _invalid(problems.errors)
    return _json(await router.batch(checks, all_or_nothing))


async def post_refund(request: web.Request) -> web.Response:
    router = _router(request)
    body, error = await read_json(request)
    if error is not None:
        return error
    problems = Problems()
    parsed = parse_refund(body, router.rules, problems)
    if parsed is None:
        return _invalid(problems.errors)
    try:
        result = await router.refund(parsed)
    except NodeUnavailable as exc:
        return problem(503, "node-unavailable", f"the key's node is unavailable: {exc}")
    status = result.status
    if status == 0:
        return problem(
            404,
            "unknown-decision",
            "no decision with this key, rule and request_id "
            "(never made, or its idempotency record expired)",
        )
    if status == 2:
        return problem(409, "already-refunded", "this decision was already refunded")
    given = []
    if status == 1:
        for spec, (count, amount) in zip(parsed.rule.limits, result.given, strict=True):
            item: dict[str, Any] = {"algorithm": spec.algorithm, "count": count}
            if spec.algorithm == "calendar" or spec.max_amount is not None:
                item["amount"] = format_amount(amount, spec.amount_scale)
            given.append(item)
    return _json(
        {
            "refunded": status == 1,
            "key": parsed.key,
            "rule": parsed.rule.public_name,
            "request_id": parsed.request_id,
            "given_back": given,
            "detail": None if status == 1 else "the decision consumed nothing",
        }
    )


@admin_only
async def post_quota_adjust(request: web.Request) -> web.Response:
    """Restock a quota counter or set what it has left (router/quota_adjust.py)."""
    router = _router(request)
    body, error = await read_json(request)
    if error is not None:
        return error
    problems = Problems()
    parsed = parse_adjust(body, router.rules, problems)
    if parsed is None:
        return _invalid(problems.errors)
    try:
        result = await router.adjust_quota(parsed)
    except NodeUnavailable as exc:
        return problem(503, "node-unavailable", f"the key's node is unavailable: {exc}")
    except AdjustRefused as exc:
        status = 502 if exc.kind == "error" else 409
        return problem(status, exc.kind, str(exc))
    return _json(result)


async def get_usage(request: web.Request) -> web.Response:
    router = _router(request)
    problems = Problems()
    body = {
        "key": request.query.get("key"),
        "rule": request.query.get("rule"),
        "cost": 0,
        "dry_run": True,
    }
    parsed = parse_check(body, router.rules, problems)
    if parsed is None:
        return _invalid(problems.errors)
    return _json(await router.check(parsed))


async def get_authz(request: web.Request) -> web.Response:
    """Forward auth for gateways (nginx auth_request, Caddy forward_auth, HAProxy):
    204 allowed, `deny_status` (429, or 403 for nginx) denied, with the RateLimit
    headers either way and Retry-After when denied. No body: gateways drop it."""
    router = _router(request)
    problems = Problems()
    parsed = parse_authz(request.query, request.headers, router.rules, problems)
    if parsed is None:
        return _invalid(problems.errors)
    result = await router.check(parsed.check)
    headers = ratelimit_headers(parsed.check, result)
    if result["degraded"]:
        headers["X-Shardlimit-Degraded"] = str(result.get("degraded_reason") or "true")
    return web.Response(status=204 if result["allowed"] else parsed.deny_status, headers=headers)


def _etag(version: int) -> dict[str, str]:
    return {"ETag": f'"{version}"'}


def _if_match(request: web.Request) -> int | web.Response | None:
    """The rules version an If-Match header names (None: no header)."""
    raw = request.headers.get("If-Match")
    if raw is None:
        return None
    value = raw.strip()
    if not IF_MATCH.fullmatch(value):  # not isdigit(): "²" is a digit, int() refuses it
        return problem(
            400, "validation", 'If-Match must be a rules version as an ETag, e.g. "3"',
            [FieldError("If-Match", "not a rules version")],
        )  # fmt: skip
    return int(value.removeprefix("W/").strip('"'))


async def _publish(
    request: web.Request, change: Change, expected: int | None
) -> int | web.Response:
    """Apply `change` to the cluster's rules (then rewrite this router's rules file)."""
    router = _router(request)
    try:
        version = await router.cluster_rules.publish(change, expected)
    except RulesConflict as exc:
        return problem(
            409, "version-conflict",
            f"{exc}, not {expected}: read them again (GET /v1/rules) and retry",
            headers=_etag(exc.current),
        )  # fmt: skip
    except RulesUnavailable as exc:
        return problem(503, "rules-not-saved", f"the cluster could not store the rules: {exc}")
    except UnknownRule as exc:
        return problem(404, "unknown-rule", f"no rule named '{exc}'")
    try:
        router.rules.write_file(router.rules.rules, version)
    except OSError as exc:
        log.warning("rules version %d stored in the cluster, not in the rules file: %s",
                    version, exc)  # fmt: skip
    return version


async def list_rules(request: web.Request) -> web.Response:
    book = _router(request).rules
    listing = [rule.to_dict() for _, rule in sorted(book.rules.items())]
    return _json({"version": book.version, "rules": listing}, headers=_etag(book.version))


@admin_only
async def put_rules(request: web.Request) -> web.Response:
    """Replace every rule at once (`shardlimit rules apply`)."""
    expected = _if_match(request)
    if isinstance(expected, web.Response):
        return expected
    body, error = await read_json(request)
    if error is not None:
        return error
    if not isinstance(body, dict) or not isinstance(body.get("rules"), dict):
        return _invalid([FieldError("rules", "is required: an object of rules by name")])
    try:
        rules = parse_rules_document(body)
    except ValidationError as exc:
        return _invalid(exc.errors or [FieldError("body", "must be an object with 'rules'")])
    problems = Problems()
    for name, rule in rules.items():
        expired_quotas(rule.limits, f"rules.{name}.limits", problems)
    if problems.errors:
        return _invalid(problems.errors)
    version = await _publish(request, lambda _current: rules, expected)
    if isinstance(version, web.Response):
        return version
    listing = [rule.to_dict() for _, rule in sorted(rules.items())]
    return _json({"version": version, "rules": listing}, headers=_etag(version))


def _rule_name(request: web.Request) -> str | web.Response:
    name = request.match_info["name"]
    if not RULE_NAME.match(name):
        return problem(
            400,
            "validation",
            "rule names are 1-64 characters of A-Z a-z 0-9 _ . : -",
            [FieldError("name", "invalid rule name")],
        )
    return name


async def get_rule(request: web.Request) -> web.Response:
    name = _rule_name(request)
    if isinstance(name, web.Response):
        return name
    book = _router(request).rules
    rule = book.get(name)
    if rule is None:
        return problem(404, "unknown-rule", f"no rule named '{name}'")
    return _json(rule.to_dict(), headers=_etag(book.version))


@admin_only
async def put_rule(request: web.Request) -> web.Response:
    name = _rule_name(request)
    if isinstance(name, web.Response):
        return name
    expected = _if_match(request)
    if isinstance(expected, web.Response):
        return expected
    body, error = await read_json(request)
    if error is not None:
        return error
    problems = Problems()
    rule = parse_rule(name, body, "body", problems)
    if rule is not None:
        expired_quotas(rule.limits, "body.limits", problems)
    if rule is None or problems.errors:
        return _invalid(problems.errors)
    if isinstance(body, dict) and body.get("name") not in (None, name):
        return _invalid([FieldError("body.name", "must match the name in the path")])
    created = False

    def upsert(current: dict[str, Rule]) -> dict[str, Rule]:
        nonlocal created
        created = name not in current
        return {**current, name: rule}

    version = await _publish(request, upsert, expected)
    if isinstance(version, web.Response):
        return version
    return _json(rule.to_dict(), status=201 if created else 200, headers=_etag(version))


@admin_only
async def delete_rule(request: web.Request) -> web.Response:
    name = _rule_name(request)
    if isinstance(name, web.Response):
        return name
    expected = _if_match(request)
    if isinstance(expected, web.Response):
        return expected

    def remove(current: dict[str, Rule]) -> dict[str, Rule]:
        if name not in current:
            raise UnknownRule(name)
        return {n: r for n, r in current.items() if n != name}

    version = await _publish(request, remove, expected)
    if isinstance(version, web.Response):
        return version
    return web.Response(status=204, headers=_etag(version))


async def get_cluster(request: web.Request) -> web.Response:
    view = _router(request).view
    stats = await view.node_stats()
    shares = view.topology.partitioner.shares()
    nodes: list[dict[str, Any]] = []
    specs = {n.id: n for n in (*view.previous_nodes(), *view.topology.nodes)}
    for spec in specs.values():
        channel = view.channels[spec.id]
        node_stats = stats.get(spec.id, {})
        nodes.append(
            {
                "id": spec.id,
                "url": spec.url,
                "weight": spec.weight,
                "state": "down" if "error" in node_stats else channel.state,
                "keys": node_stats.get("keys"),
                "memory_bytes": node_stats.get("memory"),
                "node_epoch": node_stats.get("epoch"),
                "share": round(shares.get(spec.id, 0.0), 6),
                "ops_routed": channel.ops,
                "node_requests": channel.requests,
                "last_error": channel.last_error,
            }
        )
    total_ops = sum(view.channels[spec_id].ops for spec_id in specs) or 1
    for node in nodes:
        node["load_share"] = round(view.channels[node["id"]].ops / total_ops, 6)
    return _json(
        {
            "epoch": view.topology.epoch,
            "partitioner": view.topology.partitioner.kind,
            "nodes": nodes,
            "migration": _router(request).resharder.status(),
        }
    )


async def get_cluster_ring(request: web.Request) -> web.Response:
    """Ring points or slot ranges of the current layout (router/ring_view.py), for /ui."""
    body = request.app[RING_VIEW].body(_router(request).view.topology)
    return web.Response(body=body, content_type="application/json")


async def get_ui(request: web.Request) -> web.Response:
    """The live cluster page (router/ui/): /ui, and its files under /ui/."""
    if request.path == "/ui/":
        raise web.HTTPFound("/ui")
    found = ui_asset(request.match_info.get("name", "index.html"))
    if found is None:
        return problem(404, "not-found", f"no file {request.path}")
    body, content_type = found
    return web.Response(body=body, content_type=content_type, charset="utf-8",
                        headers=UI_HEADERS)  # fmt: skip


def _new_node(body: Any, existing: set[str]) -> NodeSpec | list[FieldError]:
    if not isinstance(body, dict):
        return [FieldError("body", "must be an object with 'url'")]
    errors: list[FieldError] = []
    url = body.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        errors.append(FieldError("url", "must be an http(s) URL of a running node"))
    node_id = body.get("id")
    if node_id is None:
        number = len(existing) + 1
        while f"n{number}" in existing:
            number += 1
        node_id = f"n{number}"
    if not isinstance(node_id, str) or not RULE_NAME.match(node_id):
        errors.append(FieldError("id", "must be 1-64 characters of A-Z a-z 0-9 _ . : -"))
    elif node_id in existing:
        errors.append(FieldError("id", f"node {node_id} already exists"))
    weight = body.get("weight", 1)
    if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 1000:
        errors.append(FieldError("weight", "must be an integer from 1 to 1000"))
    if errors:
        return errors
    return NodeSpec(str(node_id), str(url).rstrip("/"), int(weight))


@admin_only
async def add_node(request: web.Request) -> web.Response:
    router = _router(request)
    body, error = await read_json(request)
    if error is not None:
        return error
    nodes = list(router.view.topology.nodes)
    spec = _new_node(body, {n.id for n in nodes})
    if isinstance(spec, list):
        return _invalid(spec)
    if router.config.tls_ca is not None and not spec.url.startswith("https://"):
        return _invalid([FieldError("url", "must be https://: this router verifies nodes' "
                                           "certificates (router.tls_ca)")])  # fmt: skip
    dry_run = bool(body.get("dry_run", False))
    if not dry_run:
        try:
            why = await _unreachable(router.view, spec)
        except ValueError as exc:
            return _invalid([FieldError("url", str(exc))])
        if why is not None:
            return problem(
                503, "node-unreachable",
                f"node {spec.id} at {spec.url} did not answer {wire.READY_PATH}: {why}; "
                "nothing was changed",
            )  # fmt: skip
    return await _reshard(router, [*nodes, spec], dry_run)


NODE_PROBE_S = 2.0  # how long a node being added has to answer its readiness probe


async def _unreachable(view: ClusterView, spec: NodeSpec) -> str | None:
    """Why a node about to be added cannot serve (None: its /readyz answered 200), found
    before any lease or topology change: a refused connection, a failed TLS handshake
    (a certificate not from the cluster's CA, a client certificate refused), no answer,
    or a node whose Redis does not answer. Raises ValueError (an unusable URL)."""
    channel = view.channel_for(spec)  # a channel of its own: not a member yet
    try:
        await channel.get(wire.READY_PATH, timeout_s=NODE_PROBE_S)
    except NodeUnavailable as exc:
        return str(exc)
    finally:
        await channel.close()
    return None


@admin_only
async def remove_node(request: web.Request) -> web.Response:
    router = _router(request)
    node_id = request.match_info["id"]
    nodes = list(router.view.topology.nodes)
    if node_id not in {n.id for n in nodes}:
        return problem(404, "unknown-node", f"no node {node_id} in the topology")
    if len(nodes) == 1:
        return problem(409, "last-node", "cannot remove the last node")
    dry_run = request.query.get("dry_run") in ("1", "true")
    return await _reshard(router, [n for n in nodes if n.id != node_id], dry_run)


async def _reshard(router: Router, nodes: list[NodeSpec], dry_run: bool) -> web.Response:
    try:
        new, moves = router.resharder.plan(nodes)
    except ValueError as exc:
        return problem(400, "bad-layout", str(exc))
    if dry_run:
        body = {"dry_run": True, "moves": moves, "shares": new.shares(), "partitioner": new.kind}
        return _json(body)
    try:
        started = await router.resharder.start(nodes)
    except ReshardError as exc:
        return problem(409, "reshard-refused", str(exc))
    return _json(started, status=202)


@admin_only
async def resume_migration(request: web.Request) -> web.Response:
    try:
        return _json(_router(request).resharder.resume(), status=202)
    except ReshardError as exc:
        return problem(409, "nothing-to-resume", str(exc))


async def get_locate(request: web.Request) -> web.Response:
    problems = Problems()
    key = parse_key(request.query.get("key"), "key", problems)
    if problems.errors:
        return _invalid(problems.errors)
    located = _router(request).view.topology.partitioner.locate(key)
    return _json({"key": key, **located})


async def healthz(request: web.Request) -> web.Response:
    return _json({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    view = _router(request).view

    async def probe(node_id: str) -> tuple[str, bool]:
        try:
            await view.channels[node_id].get("/readyz", timeout_s=0.5)
        except NodeUnavailable:
            return node_id, False
        return node_id, True

    states = dict(await asyncio.gather(*(probe(n) for n in view.channels)))
    down = sorted(n for n, ok in states.items() if not ok)
    body = {
        "status": "degraded" if down else "ready",
        "epoch": view.topology.epoch,
        "nodes": {n: ("up" if ok else "down") for n, ok in sorted(states.items())},
    }
    return _json(body, status=503 if down else 200)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus exposition; no token, like /healthz: no label carries a limit key."""
    return web.Response(
        body=_router(request).render_metrics(),
        headers={"Content-Type": CONTENT_TYPE_LATEST, "X-Content-Type-Options": "nosniff"},
    )


async def get_openapi(request: web.Request) -> web.Response:
    return _json(openapi_document())


@web.middleware
async def replay_conflicts(request: web.Request, handler: Any) -> web.StreamResponse:
    """A request_id names one check: reused with other limits, its first decision cannot
    answer this one (the replay consumed nothing)."""
    try:
        response: web.StreamResponse = await handler(request)
    except ReplayMismatch as exc:
        return problem(409, "request-id-reused", str(exc))
    return response


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
        client_max_size=MAX_BODY, middlewares=[observe, problem_middleware, replay_conflicts]
    )
    router = Router(config, admin_token, cluster_token)
    app[ROUTER] = router
    app[RING_VIEW] = RingView()
    app.router.add_post("/v1/check", post_check)
    app.router.add_post("/v1/check/batch", post_batch)
    app.router.add_post("/v1/refund", post_refund)
    app.router.add_post("/v1/quota/adjust", post_quota_adjust)
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
        from router.envoy import EnvoyListener  # grpcio is loaded only when it is on

        envoy = EnvoyListener(router)
        app[ENVOY] = envoy

        async def start_envoy(_app: web.Application) -> None:
            await envoy.start()

        async def stop_envoy(_app: web.Application) -> None:
            await envoy.stop()  # on shutdown: before the router's cleanup

        app.on_startup.append(start_envoy)
        app.on_shutdown.append(stop_envoy)
    return app
