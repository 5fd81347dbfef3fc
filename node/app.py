"""The counter node: an aiohttp app in front of one Redis; its endpoints are in
node/edge/, by concern."""

from __future__ import annotations

from aiohttp import web

from cluster import wire
from cluster.web.problem import problem_middleware
from node.config import NodeConfig
from node.edge import (
    batch_api,
    cluster_state_api,
    coordination_api,
    migration_api,
    status_api,
    topology_api,
)
from node.edge.boundary import redis_boundary
from node.edge.channel_server import ChannelServer
from node.edge.internal import STATE
from node.state import NodeState

__all__ = ["STATE", "create_app"]

MAX_BODY = 16 * 1024 * 1024
CHANNEL: web.AppKey[ChannelServer] = web.AppKey("channel")


async def _on_startup(app: web.Application) -> None:
    state = app[STATE]
    await state.start()
    state.channel_port = await app[CHANNEL].start()


async def _on_cleanup(app: web.Application) -> None:
    await app[CHANNEL].close()
    await app[STATE].close()


def create_app(config: NodeConfig) -> web.Application:
    """The node app (node/config.py: its settings)."""
    state = NodeState(config)
    app = web.Application(
        client_max_size=MAX_BODY,
        middlewares=[problem_middleware, redis_boundary(state.redis, state.counters)],
    )
    app[STATE] = state
    app[CHANNEL] = ChannelServer(state, config.host, config.server_ssl, config.channel_port)
    app.router.add_post(wire.BATCH_PATH, batch_api.batch)
    app.router.add_post(wire.DECISION_PATH, coordination_api.decide)
    app.router.add_post(wire.DECISIONS_HANDOVER_PATH, coordination_api.hand_over_decisions)
    app.router.add_post(wire.DECISIONS_ADOPT_PATH, coordination_api.adopt_decisions)
    app.router.add_put(wire.TOPOLOGY_PATH, topology_api.put_topology)
    app.router.add_get(wire.TOPOLOGY_PATH, topology_api.get_topology)
    app.router.add_post(wire.EXPORT_PATH, migration_api.export_keys)
    app.router.add_post(wire.IMPORT_PATH, migration_api.import_keys)
    app.router.add_post(wire.LANDED_PATH, migration_api.landed_keys)
    app.router.add_post(wire.HOLDS_SETTLE_PATH, coordination_api.settle_holds)
    app.router.add_post(wire.HOLDS_ADOPT_PATH, coordination_api.adopt_holds)
    app.router.add_post(wire.MIGRATE_PATH, migration_api.migrate_step)
    app.router.add_post(wire.LEASE_PATH, cluster_state_api.lease)
    app.router.add_get(wire.RULES_PATH, cluster_state_api.get_rules)
    app.router.add_put(wire.RULES_PATH, cluster_state_api.put_rules)
    app.router.add_post(wire.MIGRATION_CLEANUP_PATH, migration_api.drop_markers)
    app.router.add_get(wire.STATS_PATH, status_api.stats)
    app.router.add_post(wire.TEST_CLOCK_PATH, cluster_state_api.set_clock)
    app.router.add_get(wire.HEALTH_PATH, status_api.healthz)
    app.router.add_get(wire.READY_PATH, status_api.readyz)
    app.router.add_get(wire.METRICS_PATH, status_api.metrics)
    app.on_startup.append(_on_startup)
    app.on_cleanup.append(_on_cleanup)
    return app
