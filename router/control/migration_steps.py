"""The node calls of a running migration: each source node copies away the keys it no
longer owns, step by step (node/migration/copy_step.py), then nodes leaving the cluster
hand their decision records to one that stays (node/holds/coordinator_records.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from cluster import wire
from cluster.model.partition import Partitioner
from router.control.cluster_view import ClusterView
from router.errors import NodeUnavailable

log = logging.getLogger("shardlimit.reshard")
STEP_ATTEMPTS = 5


class MigrationRun(Protocol):
    """Where the steps report (router/control/resharding.py `Resharder`)."""

    progress: dict[str, Any]
    # Why the migration cannot go on right now: {"node", "reason"} (None: it can).
    blocked: dict[str, str] | None
    moved_keys_total: int
    step_keys: int


class MigrationSteps:
    def __init__(self, view: ClusterView, run: MigrationRun) -> None:
        self.view = view
        self.run = run

    async def copy(self, migration_id: str, previous: Partitioner) -> None:
        """Every source of the `previous` layout copies what it no longer owns."""
        # One source at a time by default: copying competes with live checks for CPU
        # (each source is also paced by its own budget, node/migration/copy_step.py).
        gate = asyncio.Semaphore(self.view.config.reshard_parallel)

        async def copy(source: str) -> None:
            async with gate:
                await self._copy_from(source, migration_id)

        await asyncio.gather(*(copy(n.id) for n in previous.nodes))

    async def hand_over_decisions(self, previous: Partitioner) -> dict[str, str]:
        """Nodes leaving the cluster give the all-or-nothing decision records they keep
        to a remaining node, before the topology without them is published; that
        topology names the successor of each. Raises NodeUnavailable."""
        topology = self.view.topology
        successors = dict(topology.successors)
        heir = min(topology.nodes, key=lambda n: n.id)
        for node in previous.nodes:
            if topology.node(node.id) is not None:
                continue
            body = {"heir": heir.id, "url": heir.url}
            try:
                answer = await self.view.clients[node.id].post(
                    wire.DECISIONS_HANDOVER_PATH, body, timeout_s=60.0
                )
            except NodeUnavailable as exc:
                self.run.blocked = {
                    "node": node.id,
                    "reason": f"decision records not handed: {exc}",
                }
                raise
            successors = {k: heir.id if v == node.id else v for k, v in successors.items()}
            successors[node.id] = heir.id
            handed = answer.get("handed")
            log.info("node %s handed %s decision records to %s", node.id, handed, heir.id)
        return successors

    async def _step(self, source: str, step: dict[str, Any]) -> Any:
        """One copy step, tried again a few times: a step is safe to repeat (what it
        moved is gone from the source, SCAN from the same cursor finds the rest), and
        a busy source Redis should not pause a whole migration."""
        for attempt in range(STEP_ATTEMPTS):
            try:
                return await self.view.clients[source].post(wire.MIGRATE_PATH, step, timeout_s=30.0)
            except NodeUnavailable as exc:
                self.run.blocked = {"node": source, "reason": f"copy step failed: {exc}"}
                if attempt == STEP_ATTEMPTS - 1:
                    raise
                log.warning("copy step on %s failed, trying again: %s", source, exc)
                await asyncio.sleep(0.5 * (attempt + 1))  # back-off before the next attempt
        raise AssertionError("unreachable")

    async def _copy_from(self, source: str, migration_id: str) -> None:
        run = self.run
        cursor = 0
        entry = run.progress["sources"][source]
        entry["copying"] = True  # past the gate of reshard_parallel sources at once
        started = time.monotonic()
        # The keys/s budget is the cluster's: shared by the sources copying at once.
        config = self.view.config
        rate = -(-config.reshard_rate // config.reshard_parallel) if config.reshard_rate else 0
        while True:
            step = {
                "migration": migration_id,
                "cursor": cursor,
                "count": run.step_keys,
                "rate": rate,
                "busy_pct": config.reshard_busy_pct,
            }
            answer = await self._step(source, step)
            run.blocked = None
            entry["scanned"] += answer["scanned"]
            entry["moved"] += answer["moved"]
            entry["holds"] = entry.get("holds", 0) + answer.get("holds", 0)
            # Where a source's copy time goes (node/migration/copy_step.py): finding,
            # moving, pausing.
            for part in ("seconds", "find_s", "move_s", "paused_s"):
                entry[part] = round(entry.get(part, 0.0) + answer.get(part, 0.0), 3)
            run.progress["keys_moved"] += answer["moved"]
            run.moved_keys_total += answer["moved"]
            elapsed = max(time.monotonic() - started, 1e-9)
            run.progress["keys_per_s"] = round(run.progress["keys_moved"] / elapsed, 1)
            cursor = int(answer["cursor"])
            if cursor == 0:
                entry["done"] = True
                return
