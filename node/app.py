"""The counter node: an aiohttp app in front of one Redis."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from cluster import wire
from cluster.model.keys import (
    LEASES,
    RULES_KEY,
    lease_key,
    limit_key_of,
)
from cluster.model.topology import Topology
from cluster.web.auth import bearer_matches
from cluster.web.problem import json_response, problem, problem_middleware, read_json
from node.batch.runner import MAX_OPS, run_batch
from node.config import NodeConfig
from node.edge.boundary import redis_boundary
from node.edge.channel_server import ChannelServer
from node.errors import PeerError
from node.health.redis_stats import redis_stats, rules_version
from node.holds.coordinator_records import parse_entries
from node.migration.entries import decode_entries, encode_entries
from node.state import NodeState
from node.topology.ownership import Role

log = logging.getLogger("shardlimit.node")
MAX_BODY = 16 * 1024 * 1024

STATE: web.AppKey[NodeState] = web.AppKey("state")
CHANNEL: web.AppKey[ChannelServer] = web.AppKey("channel")
Handler = Callable[[web.Request], Awaitable[web.Response]]


def _authorized(request: web.Request) -> bool:
    state = request.app[STATE]
    return bearer_matches(request.headers.get("Authorization"), state.cluster_token)


InternalHandler = Callable[[web.Request, NodeState, Any], Awaitable[web.Response]]


def internal(
    body: type[wire.Control] | None = None, *, slug: str = "bad-request"
) -> Callable[[InternalHandler], Handler]:
    """Node endpoints: cluster token first, then the body decoded into its control
    message (cluster/wire.py); one that does not fit is a 400 `slug` naming the field."""

    def wrap(handler: InternalHandler) -> Handler:
        @functools.wraps(handler)
        async def endpoint(request: web.Request) -> web.Response:
            if not _authorized(request):
                return problem(401, "unauthorized", "cluster token required")
            message: Any = None
            if body is not None:
                try:
                    message = msgspec.json.decode(await request.read(), type=body)
                except (msgspec.ValidationError, *wire.DECODE_ERRORS) as exc:
                    return problem(400, slug, str(exc))
            return await handler(request, request.app[STATE], message)

        return endpoint

    return wrap


def _reply(state: NodeState, results: list[wire.Result]) -> web.Response:
    reply = wire.BatchReply(state.epoch, state.node_id, state.liveness.port, results)
    return web.Response(body=wire.encode(reply), content_type=wire.CONTENT_TYPE)


@internal()
async def batch(request: web.Request, state: NodeState, body: Any) -> web.Response:
    """A batch over HTTP (node/batch/runner.py); routers send theirs on the channel."""
    try:
        message = wire.decode_batch(await request.read())
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return problem(400, "bad-batch", f"not a batch: {exc}")
    if len(message.ops) > MAX_OPS:
        return problem(413, "too-many-ops", f"at most {MAX_OPS} ops per batch")
    try:
        results = await run_batch(state, message.deadline_ms, message.ops)
    except PeerError as exc:
        return problem(503, "import-failed", f"could not import moving keys: {exc}")
    return _reply(state, results)


def _parse_topology(data: Any) -> Topology | str:
    try:
        return Topology.from_dict(data if isinstance(data, dict) else {})
    except (ValueError, TypeError, KeyError) as exc:
        return str(exc)


def _newer_topology(data: Any, epoch: int) -> Topology | None:
    """The topology a peer sent along, when it is valid and newer than `epoch`. Its epoch is
    looked at first: building a ring costs about a millisecond, paid on every first-touch
    pull if parsed each time, and a pull almost always carries the epoch we have."""
    sent = data.get("epoch") if isinstance(data, dict) else None
    if not isinstance(sent, int) or sent <= epoch:
        return None
    newer = _parse_topology(data)
    return newer if isinstance(newer, Topology) else None


@internal()
async def put_topology(request: web.Request, state: NodeState, body: Any) -> web.Response:
    body, error = await read_json(request)
    if error is not None:
        return error
    topology = _parse_topology(body)
    if isinstance(topology, str):
        return problem(400, "bad-topology", topology)
    refused = await state.kept.install(topology)
    if refused is not None:
        return problem(409, refused.kind, refused.detail)
    if state.ownership is not None:
        state.migrator.sources.prepare(state.ownership)
    return json_response({"epoch": state.epoch})


@internal()
async def get_topology(request: web.Request, state: NodeState, body: Any) -> web.Response:
    if state.topology is None:
        return problem(404, "no-topology", "this node has no topology yet")
    return json_response(state.topology.to_dict())


@internal(wire.ExportKeys, slug="bad-keys")
async def export_keys(
    request: web.Request, state: NodeState, body: wire.ExportKeys
) -> web.Response:
    """DUMP of Redis keys for a node importing them (first touch during a migration)."""
    keys = body.keys
    newer = _newer_topology(body.topology, state.epoch)
    if newer is not None:
        # The asking node is ahead of us (a push to us is on its way): take it now.
        await state.kept.install(newer)
    else:
        # A push of this topology may have come first and still wait for batches of
        # the older one: a key they count is frozen only once they reached Redis.
        await state.gate.drained(state.epoch)
    ownership = state.ownership
    # Safe to hand out exactly the keys this node no longer serves: it never writes
    # them again, so the copy is frozen (and empty once the background copy ran).
    limit_keys = [limit_key_of(key) for key in keys]
    if ownership is None or any(
        lk is None or ownership.role(lk)[0] is not Role.MOVED for lk in limit_keys
    ):
        return problem(409, "not-moving", "only keys this node no longer serves can be exported")
    entries = await state.migrator.export(keys, reverted=ownership.reverts)
    return json_response({"entries": encode_entries(entries)})


@internal(wire.ImportKeys, slug="bad-import")
async def import_keys(
    request: web.Request, state: NodeState, body: wire.ImportKeys
) -> web.Response:
    migration = body.migration
    if state.ownership is None or state.ownership.migration_id != migration:
        await state.kept.catch_up()  # another endpoint of the shard may be ahead
    if state.ownership is None:
        return problem(400, "bad-import", "this node is in no migration")
    if state.ownership.migration_id != migration:
        return problem(409, "wrong-migration", "this node is not in that migration")
    try:
        entries = decode_entries(body.entries)
    except (ValueError, TypeError) as exc:
        return problem(400, "bad-import", str(exc))
    reverting = state.ownership.reverts is not None
    restored = await state.migrator.import_entries(migration, entries, replace=reverting)
    # The sender drops its copy on this answer: with replicas, only once one holds them.
    needed = state.replicas.needed
    if state.store.replicated and not await state.migrator.replica_holds_writes(needed):
        return problem(503, "no-replica", "no replica acknowledged the imported keys in time")
    return json_response({"restored": restored, "received": len(entries)})


@internal(wire.ExportKeys, slug="bad-keys")
async def landed_keys(
    request: web.Request, state: NodeState, body: wire.ExportKeys
) -> web.Response:
    """Which of `keys` (a source MIGRATEd them here with COPY) this node's Redis lacks;
    with replicas, answered only once one of them holds the others: the source drops
    its copy of those on this answer (node/migration/durable.py)."""
    replicated = state.store.replicated
    needed = state.replicas.needed
    missing, acked = await state.migrator.landed(body.keys, replicated, needed)
    if replicated and acked < needed:
        state.replicas.fell_short(acked)
        return problem(503, "no-replica", "no replica acknowledged the migrated keys in time")
    return json_response({"missing": missing, "replicated": replicated})


@internal(wire.MigrateStep, slug="bad-step")
async def migrate_step(
    request: web.Request, state: NodeState, body: wire.MigrateStep
) -> web.Response:
    """One background-copy step on a source node (driven by the orchestrator)."""
    migration, cursor, count = body.migration, body.cursor, body.count
    rate, busy_pct = body.rate, body.busy_pct
    if state.ownership is None or state.ownership.migration_id != migration:
        await state.kept.catch_up()  # another endpoint of the shard may be ahead
    ownership = state.ownership
    if ownership is None or ownership.migration_id != migration:
        return problem(409, "wrong-migration", "this node is not in that migration")
    try:
        budget = state.migrator.budget(migration, rate, busy_pct)
        guard = functools.partial(state.kept.moves_of_epoch, ownership.epoch)
        step = await state.migrator.copy_batch(
            ownership, cursor, count, budget, guard, replicated=state.store.replicated
        )
        if step["cursor"] == 0:
            # Every moving key is at its new owner now: so go the holds on them.
            step["holds"] = await state.holds.hand_over(ownership.moving_away)
    except PeerError as exc:
        return problem(503, "peer-unavailable", str(exc))
    state.metrics.keys_copied.inc(step["moved"])
    return json_response(step)


@internal()
async def stats(request: web.Request, state: NodeState, body: Any) -> web.Response:
    """The node's stats; `?brief=1` (wire.EPOCH_STATS_PATH): only what a router's epoch
    poll follows, without Redis' INFO, whose reading and parsing twice a second showed
    in live checks' p99."""
    topology = state.topology
    answer: dict[str, Any] = {
        "node": state.node_id,
        "epoch": state.epoch,
        "live": state.liveness.port,
        "cluster_id": topology.cluster_id if topology else None,
        "partitioner": topology.partitioner.kind if topology else None,
    }
    if request.query.get("brief"):
        answer["rules_version"] = await rules_version(state.redis)
        return json_response(answer)
    answer |= {
        **await redis_stats(state.redis, state.failovers),
        "singleton": state.sweeper_lease.held,  # this endpoint sweeps the shard's holds
        "expired_batches": state.expired_batches,
        "undone_checks": state.undone_checks,
    }
    return json_response(answer)


@internal()
async def get_rules(request: web.Request, state: NodeState, body: Any) -> web.Response:
    """The cluster's rules document as this node holds it (version 0: none yet)."""
    version, doc = await state.redis.hmget(RULES_KEY, ["version", "doc"])
    return json_response({"version": int(version or 0), "rules": orjson.loads(doc) if doc else {}})


@internal(wire.RulesDocument, slug="bad-rules")
async def put_rules(
    request: web.Request, state: NodeState, body: wire.RulesDocument
) -> web.Response:
    """Store a rules document if its version is newer than the one held. The router
    validated it; it is kept as given (JSON) and served back as is."""
    stored, held = await state.rules_script(
        keys=[RULES_KEY], args=[body.version, orjson.dumps(body.rules).decode()]
    )
    return json_response({"stored": stored == 1, "version": held})


@internal(wire.ClockOffset, slug="bad-offset")
async def set_clock(request: web.Request, state: NodeState, body: wire.ClockOffset) -> web.Response:
    """Test mode only: shift the clock every script sees."""
    if not state.test_mode:
        return problem(404, "not-found", "not found")
    state.store.offset_ms = body.offset_ms
    return json_response({"offset_ms": body.offset_ms})


@internal(wire.MigrationCleanup, slug="bad-migration")
async def drop_markers(
    request: web.Request, state: NodeState, body: wire.MigrationCleanup
) -> web.Response:
    migration = body.migration
    if state.ownership is not None and state.ownership.migration_id == migration:
        return problem(409, "migration-running", "that migration is still in progress here")
    dropped = await state.migrator.drop_markers(migration)
    return json_response({"dropped": dropped})


@internal(wire.Lease, slug="bad-lease")
async def lease(request: web.Request, state: NodeState, body: wire.Lease) -> web.Response:
    """A change lease, `name` "topology" (the default) or "rules", held in this node's
    Redis when it is the lock node."""
    if body.name not in LEASES:
        return problem(400, "bad-lease", f"name must be one of: {', '.join(LEASES)}")
    held = await state.lease_script(
        keys=[lease_key(body.name)], args=[body.action, body.token, body.ttl_ms]
    )
    return json_response({"held": held == 1})


async def healthz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    live, channel = state.liveness.port, state.channel_port
    return json_response({"status": "ok", "node": state.node_id, "live": live, "channel": channel})


async def metrics(request: web.Request) -> web.Response:
    """Prometheus exposition (node/health/metrics.py); no token, like /healthz."""
    body = await request.app[STATE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def readyz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    await state.redis.ping()
    return json_response({"status": "ready", "node": state.node_id, "epoch": state.epoch})


@internal(wire.Decision, slug="bad-decision")
async def decide(request: web.Request, state: NodeState, body: wire.Decision) -> web.Response:
    """This node coordinates an all-or-nothing batch: record its decision, first wins.

    {"batch", "decision", "holds"?}: record (holds: the ids of the batch's holds; a
    "commit" naming them lasts until they are all settled); {"batch", "settled"}:
    those holds are settled (a node's sweeper reports them)."""
    batch, settled = body.batch, body.settled
    holds = settled if settled is not None else body.holds
    if len(holds) > MAX_OPS:
        return problem(413, "too-many-holds", f"at most {MAX_OPS} holds")
    if settled is not None:
        left = await state.store.settled(batch, holds)
        if left < 0:
            return _handed_over(state)
        return json_response({"batch": batch, "unsettled": left})
    wanted = body.decision
    if wanted is None:
        return problem(400, "bad-decision", "decision must be 'commit' or 'abort'")
    stored = await state.store.decide(batch, wanted, holds)
    if stored == "fenced":
        return _handed_over(state)
    return json_response({"batch": batch, "decision": stored})


def _handed_over(state: NodeState) -> web.Response:
    return problem(
        409,
        "decisions-handed-over",
        f"node {state.node_id} left the cluster and handed its decision records "
        "to its successor (see the topology's successors)",
    )


@internal(wire.DecisionsHandover, slug="bad-handover")
async def hand_over_decisions(
    request: web.Request, state: NodeState, body: wire.DecisionsHandover
) -> web.Response:
    """This node leaves the cluster: fence its decisions, give its records to `heir`."""
    heir, url = body.heir, body.url
    try:
        handed = await state.records.hand_over(heir, url.rstrip("/"))
    except PeerError as exc:
        return problem(503, "peer-unavailable", f"{heir} did not take the records: {exc}")
    return json_response({"handed": handed, "heir": heir})


@internal(wire.Entries, slug="bad-decisions")
async def adopt_decisions(
    request: web.Request, state: NodeState, body: wire.Entries
) -> web.Response:
    entries = parse_entries(body.entries)
    if isinstance(entries, str):
        return problem(400, "bad-decisions", entries)
    return json_response({"adopted": await state.records.adopt(entries)})


@internal(wire.Holds, slug="bad-holds")
async def settle_holds(request: web.Request, state: NodeState, body: wire.Holds) -> web.Response:
    """Settle holds whose key lives here now (their old owner's sweeper sends them)."""
    done = await state.holds.settle_for_peer(body.holds)
    if isinstance(done, str):
        return problem(400, "bad-holds", done)
    return json_response({"settled": done})


@internal(wire.Holds, slug="bad-holds")
async def adopt_holds(request: web.Request, state: NodeState, body: wire.Holds) -> web.Response:
    """Take over holds of keys that moved here (the old owner's copy is done)."""
    added = await state.holds.adopt(body.holds)
    if isinstance(added, str):
        return problem(400, "bad-holds", added)
    return json_response({"adopted": added})


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
    app[CHANNEL] = ChannelServer(state, config.host, config.server_ssl)
    app.router.add_post(wire.BATCH_PATH, batch)
    app.router.add_post(wire.DECISION_PATH, decide)
    app.router.add_post(wire.DECISIONS_HANDOVER_PATH, hand_over_decisions)
    app.router.add_post(wire.DECISIONS_ADOPT_PATH, adopt_decisions)
    app.router.add_put(wire.TOPOLOGY_PATH, put_topology)
    app.router.add_get(wire.TOPOLOGY_PATH, get_topology)
    app.router.add_post(wire.EXPORT_PATH, export_keys)
    app.router.add_post(wire.IMPORT_PATH, import_keys)
    app.router.add_post(wire.LANDED_PATH, landed_keys)
    app.router.add_post(wire.HOLDS_SETTLE_PATH, settle_holds)
    app.router.add_post(wire.HOLDS_ADOPT_PATH, adopt_holds)
    app.router.add_post(wire.MIGRATE_PATH, migrate_step)
    app.router.add_post(wire.LEASE_PATH, lease)
    app.router.add_get(wire.RULES_PATH, get_rules)
    app.router.add_put(wire.RULES_PATH, put_rules)
    app.router.add_post(wire.MIGRATION_CLEANUP_PATH, drop_markers)
    app.router.add_get(wire.STATS_PATH, stats)
    app.router.add_post(wire.TEST_CLOCK_PATH, set_clock)
    app.router.add_get(wire.HEALTH_PATH, healthz)
    app.router.add_get(wire.READY_PATH, readyz)
    app.router.add_get(wire.METRICS_PATH, metrics)
    app.on_startup.append(_on_startup)
    app.on_cleanup.append(_on_cleanup)
    return app
