"""A migration between nodes: first-touch export and import, the landed check of a
direct copy, the orchestrator's copy steps, and the markers' cleanup afterwards."""

from __future__ import annotations

import functools

from aiohttp import web

from cluster import wire
from cluster.model.keys import limit_key_of
from cluster.web.problem import json_response, problem
from node.edge.internal import internal
from node.edge.topology_api import newer_topology
from node.errors import PeerError
from node.migration.entries import decode_entries, encode_entries
from node.state import NodeState
from node.topology.ownership import Role


@internal(wire.ExportKeys, slug="bad-keys")
async def export_keys(
    request: web.Request, state: NodeState, body: wire.ExportKeys
) -> web.Response:
    """DUMP of Redis keys for a node importing them (first touch during a migration)."""
    keys = body.keys
    newer = newer_topology(body.topology, state.epoch)
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


@internal(wire.MigrationCleanup, slug="bad-migration")
async def drop_markers(
    request: web.Request, state: NodeState, body: wire.MigrationCleanup
) -> web.Response:
    migration = body.migration
    if state.ownership is not None and state.ownership.migration_id == migration:
        return problem(409, "migration-running", "that migration is still in progress here")
    dropped = await state.migrator.drop_markers(migration)
    return json_response({"dropped": dropped})
