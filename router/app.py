"""The router: the public HTTP API of shardlimit, its endpoints in router/api/ by concern."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from cluster.model.errors import ValidationError
from cluster.web.problem import problem_middleware
from router.api import cluster_api, decisions_api, rules_api, status_api
from router.api.check_answers import CHECK_BATCH_PATH, CHECK_PATH, MAX_BODY
from router.api.cluster_api import RING_VIEW
from router.api.handler_tools import ROUTER
from router.api.leases import RELEASE_PATH, RENEW_PATH
from router.api.membership import abort_migration, add_node, remove_node, resume_migration
from router.api.problems import problem_answers
from router.api.ring_view import RingView
from router.config import RouterConfig
from router.errors import SettingsError
from router.metrics import endpoint_of
from router.service import Router

__all__ = ["ENVOY", "ROUTER", "create_app"]

# The Envoy rate-limit gRPC listener (router/envoy/servicer.py), present when grpc_port is set.
ENVOY: web.AppKey[Any] = web.AppKey("envoy")


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
    app.router.add_post(CHECK_PATH, decisions_api.post_check)
    app.router.add_post(CHECK_BATCH_PATH, decisions_api.post_batch)
    app.router.add_post("/v1/refund", decisions_api.post_refund)
    app.router.add_post("/v1/quota/adjust", decisions_api.post_quota_adjust)
    app.router.add_post(RENEW_PATH, decisions_api.post_lease_renew)
    app.router.add_post(RELEASE_PATH, decisions_api.post_lease_release)
    app.router.add_get("/v1/usage", decisions_api.get_usage)
    app.router.add_get("/v1/authz", decisions_api.get_authz)
    app.router.add_get("/v1/rules", rules_api.list_rules)
    app.router.add_put("/v1/rules", rules_api.put_rules)
    app.router.add_get("/v1/rules/{name}", rules_api.get_rule)
    app.router.add_put("/v1/rules/{name}", rules_api.put_rule)
    app.router.add_delete("/v1/rules/{name}", rules_api.delete_rule)
    app.router.add_get("/v1/cluster", cluster_api.get_cluster)
    app.router.add_get("/v1/cluster/ring", cluster_api.get_cluster_ring)
    app.router.add_post("/v1/cluster/nodes", add_node)
    app.router.add_delete("/v1/cluster/nodes/{id}", remove_node)
    app.router.add_post("/v1/cluster/migration/resume", resume_migration)
    app.router.add_post("/v1/cluster/migration/abort", abort_migration)
    app.router.add_get("/v1/locate", cluster_api.get_locate)
    app.router.add_get("/healthz", status_api.healthz)
    app.router.add_get("/readyz", status_api.readyz)
    app.router.add_get("/metrics", status_api.metrics)
    app.router.add_get("/openapi.json", status_api.get_openapi)
    app.router.add_get("/ui", cluster_api.get_ui)
    app.router.add_get("/ui/", cluster_api.get_ui)
    app.router.add_get("/ui/{name}", cluster_api.get_ui)

    async def on_startup(app: web.Application) -> None:
        try:
            await app[ROUTER].start()
        except ValidationError as exc:
            raise SettingsError(f"rules file rejected: {exc}") from exc

    async def on_cleanup(app: web.Application) -> None:
        await app[ROUTER].stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    if config.grpc_port is not None:
        try:
            from router.envoy.servicer import EnvoyListener  # grpcio is loaded only when it is on
        except ImportError as exc:
            raise SettingsError(
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
