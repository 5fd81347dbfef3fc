"""The orchestrator of a live reshard (docs/resharding.md), run inside a router."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from cluster import wire
from cluster.model.nodes import NodeSpec
from cluster.model.partition import Partitioner, partitioner_from_dict
from router.control.cluster_view import ClusterView
from router.errors import MigrationBlocked, NodeUnavailable, ReshardError

log = logging.getLogger("shardlimit.reshard")
STEP_ATTEMPTS = 5
# The nodes a migration leads to, from the current ones (raises ReshardError).
Change = Callable[[list[NodeSpec]], list[NodeSpec]]
PUSH_ATTEMPTS = 10  # rounds of topology pushes, 0.5 s apart, before a migration pauses


class Resharder:
    """Serialised by a lease; one migration at a time; resumable from the topology."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view
        # A crashed orchestrator blocks a new one at most one lease TTL.
        self.lease_ttl_ms = view.config.reshard_lease_ttl_ms
        self.step_keys = view.config.reshard_step_keys
        self.task: asyncio.Task[None] | None = None
        self.progress: dict[str, Any] = {}
        self.token = secrets.token_hex(16)
        self.last_error: str | None = None
        # Why the migration cannot go on right now: {"node", "reason"} (None: it can).
        self.blocked: dict[str, str] | None = None
        self.announced = asyncio.Event()  # the migrating topology reached every node
        self.moved_keys_total = 0  # over every migration this router ran, for /metrics

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def plan(self, nodes: Sequence[NodeSpec]) -> tuple[Partitioner, list[dict[str, Any]]]:
        current = self.view.topology.partitioner
        new = current.resized(nodes)
        return new, [m.to_dict() for m in current.plan(new)]

    def status(self) -> dict[str, Any] | None:
        migration = self.view.topology.migration
        if migration is None and not self.progress:
            return None
        out = dict(self.progress)
        if migration is not None:
            out["id"] = migration.get("id")
            out.setdefault("phase", "copying")
            if migration.get("reverts"):
                out["reverts"] = migration["reverts"]
        out["running"] = self.running
        out["last_error"] = self.last_error
        out["blocked"] = self.blocked
        return out

    async def start(self, change: Change) -> dict[str, Any]:
        """Begin a migration to `change(the current nodes)`, computed under the lease
        from the layout the nodes hold (another router may have changed it since this
        one last looked); returns once every node took the migrating topology. Raises
        ReshardError (refused: nothing changed) or MigrationBlocked (the topology changed
        but could not reach every node: see `abort`)."""
        if self.running or self.view.topology.migration is not None:
            raise ReshardError("a migration is already in progress; see GET /v1/cluster")
        await self._lease("acquire")
        try:
            await self.view.refresh_from_nodes()
            current = self.view.topology
            if current.migration is not None:
                raise ReshardError("a migration is already in progress; see GET /v1/cluster")
            nodes = change(list(current.nodes))
            try:
                new, moves = self.plan(nodes)
            except ValueError as exc:
                raise ReshardError(str(exc), "bad-layout") from None
            if not moves and new.to_dict() == current.partitioner.to_dict():
                raise ReshardError("nothing to move: the layout would not change")
        except BaseException:
            with contextlib.suppress(ReshardError):
                await self._lease("release")
            raise
        migration = {
            "id": uuid.uuid4().hex[:12],
            "from": current.partitioner.to_dict(),
            "started": time.time(),
        }
        # A node re-added under the id of one that left keeps its own records again.
        ids = {n.id for n in nodes}
        successors = {k: v for k, v in current.successors.items() if k not in ids}
        migrating = dataclasses.replace(
            current,
            epoch=current.epoch + 1,
            partitioner=new,
            migration=migration,
            successors=successors,
        )
        self.view.adopt(migrating)
        await self._launch_announced()
        return {"epoch": migrating.epoch, "migration": migration["id"], "moves": moves}

    async def abort(self) -> dict[str, Any]:
        """Undo the migration in progress: a migration back to the previous layout, which
        hands back the keys already copied (node/migration/migrator.py). Returns once every node
        took it; raises ReshardError (nothing to abort) or MigrationBlocked."""
        current = self.view.topology
        migration = current.migration
        if migration is None:
            raise ReshardError("no migration to abort", "nothing-to-abort")
        if migration.get("reverts"):
            raise ReshardError(
                f"migration {migration['id']} already undoes {migration['reverts']}; "
                "finish it with `shardlimit reshard resume`"
            )
        await self._cancel()
        await self._acquire_patiently()
        back = {
            "id": uuid.uuid4().hex[:12],
            "from": current.partitioner.to_dict(),
            "reverts": migration["id"],
            "started": time.time(),
        }
        reverting = dataclasses.replace(
            current,
            epoch=current.epoch + 1,
            partitioner=partitioner_from_dict(migration["from"]),
            migration=back,
        )
        self.view.adopt(reverting)
        log.warning("migration %s aborted: %s hands its keys back", migration["id"], back["id"])
        await self._launch_announced()
        return {"epoch": reverting.epoch, "migration": back["id"], "reverts": migration["id"]}

    def resume(self) -> dict[str, Any]:
        migration = self.view.topology.migration
        if migration is None:
            raise ReshardError("no migration to resume", "nothing-to-resume")
        if not self.running:
            self._launch()
        return {"epoch": self.view.topology.epoch, "migration": migration["id"]}

    async def _cancel(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    def _launch(self) -> None:
        self.last_error = None
        self.blocked = None
        self.announced.clear()
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _launch_announced(self) -> None:
        """Launch the migration task; return once its topology reached every node."""
        self._launch()
        task = self.task
        assert task is not None
        announced = asyncio.ensure_future(self.announced.wait())
        try:
            await asyncio.wait({announced, task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            announced.cancel()
        if not self.announced.is_set():
            raise MigrationBlocked(self.last_error or "the migration stopped", self.blocked)

    async def _lease(self, action: str) -> None:
        try:
            held = await self.view.lease("topology", action, self.token, self.lease_ttl_ms)
        except NodeUnavailable as exc:
            raise ReshardError(f"lease {action} failed: {exc}") from exc
        if not held and action != "release":
            raise ReshardError("another topology change holds the lease")

    async def _acquire_patiently(self) -> None:
        """A crashed holder's lease runs out after its TTL; wait that long at most."""
        deadline = time.monotonic() + 2 * self.lease_ttl_ms / 1000
        while True:
            try:
                await self._lease("acquire")
                return
            except ReshardError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)  # retry cadence while the old lease runs out

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl_ms / 3000)  # renewal cadence
            await self._lease("renew")

    async def _run(self) -> None:
        renew = asyncio.get_running_loop().create_task(self._renew_forever())
        try:
            await self._acquire_patiently()
            await self._migrate()
        except (ReshardError, NodeUnavailable) as exc:
            self.last_error = str(exc)
            self.progress["phase"] = "paused"
            log.error("migration paused (run `shardlimit reshard resume`): %s", exc)
        finally:
            renew.cancel()
            with contextlib.suppress(asyncio.CancelledError, ReshardError):
                await renew
            with contextlib.suppress(ReshardError):
                await self._lease("release")

    async def _push_all(self) -> None:
        ids = self.view.member_ids()
        epoch = self.view.topology.epoch
        for _attempt in range(PUSH_ATTEMPTS):
            results = await asyncio.gather(*(self.view.push_topology(n) for n in ids))
            if all(results):
                self.blocked = None
                return
            failed = [n for n, ok in zip(ids, results, strict=True) if not ok]
            why = self.view.push_failures.get(failed[0], "no answer")
            self.blocked = {"node": failed[0], "reason": f"epoch {epoch} not taken: {why}"}
            await asyncio.sleep(0.5)  # retry cadence while a node is unreachable
        assert self.blocked is not None
        raise ReshardError(f"node {self.blocked['node']}: {self.blocked['reason']}")

    async def _migrate(self) -> None:
        topology = self.view.topology
        migration = topology.migration
        assert migration is not None
        previous = partitioner_from_dict(migration["from"])
        self.progress = {
            "id": migration["id"],
            "phase": "announcing",
            "epoch": topology.epoch,
            "sources": {n.id: {"scanned": 0, "moved": 0, "done": False} for n in previous.nodes},
            "keys_moved": 0,
            "keys_per_s": 0.0,
        }
        if migration.get("reverts"):
            self.progress["reverts"] = migration["reverts"]
        await self._push_all()
        self.announced.set()
        self.progress["phase"] = "copying"
        started = time.monotonic()
        # One source at a time by default: copying competes with live checks for CPU
        # (each source is also paced by its own budget, node/migration/copy_step.py).
        gate = asyncio.Semaphore(self.view.config.reshard_parallel)

        async def copy(source: str) -> None:
            async with gate:
                await self._copy_from(source, migration["id"])

        await asyncio.gather(*(copy(n.id) for n in previous.nodes))
        elapsed = max(time.monotonic() - started, 1e-9)
        self.progress["keys_per_s"] = round(self.progress["keys_moved"] / elapsed, 1)
        self.progress["seconds"] = round(elapsed, 3)
        self.progress["phase"] = "finalizing"
        successors = await self._hand_over_decisions(previous)
        final = dataclasses.replace(
            self.view.topology,
            epoch=self.view.topology.epoch + 1,
            migration=None,
            successors=successors,
        )
        # Push to every node of the migration (removed nodes learn they own nothing).
        members = self.view.member_ids()
        self.view.adopt(final)
        for node_id in members:
            await self.view.push_topology(node_id)
        ids = [migration["id"], *([migration["reverts"]] if migration.get("reverts") else [])]
        for node_id in members:
            for migration_id in ids:
                with contextlib.suppress(NodeUnavailable):  # markers also expire on their own
                    await self.view.channels[node_id].post(
                        wire.MIGRATION_CLEANUP_PATH, {"migration": migration_id}, timeout_s=30.0
                    )
        self.progress["phase"] = "done"
        self.progress["epoch"] = final.epoch
        log.info("migration %s done: %d keys moved", migration["id"], self.progress["keys_moved"])

    async def _hand_over_decisions(self, previous: Partitioner) -> dict[str, str]:
        """Nodes leaving the cluster give the all-or-nothing decision records they keep
        to a remaining node (node/holds/coordinator_records.py), before the topology without them is
        published; that topology names the successor of each. Raises NodeUnavailable."""
        topology = self.view.topology
        successors = dict(topology.successors)
        heir = min(topology.nodes, key=lambda n: n.id)
        for node in previous.nodes:
            if topology.node(node.id) is not None:
                continue
            body = {"heir": heir.id, "url": heir.url}
            try:
                answer = await self.view.channels[node.id].post(
                    wire.DECISIONS_HANDOVER_PATH, body, timeout_s=60.0
                )
            except NodeUnavailable as exc:
                self.blocked = {"node": node.id, "reason": f"decision records not handed: {exc}"}
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
                return await self.view.channels[source].post(
                    wire.MIGRATE_PATH, step, timeout_s=30.0
                )
            except NodeUnavailable as exc:
                self.blocked = {"node": source, "reason": f"copy step failed: {exc}"}
                if attempt == STEP_ATTEMPTS - 1:
                    raise
                log.warning("copy step on %s failed, trying again: %s", source, exc)
                await asyncio.sleep(0.5 * (attempt + 1))  # back-off before the next attempt
        raise AssertionError("unreachable")

    async def _copy_from(self, source: str, migration_id: str) -> None:
        cursor = 0
        entry = self.progress["sources"][source]
        started = time.monotonic()
        # The keys/s budget is the cluster's: shared by the sources copying at once.
        config = self.view.config
        rate = -(-config.reshard_rate // config.reshard_parallel) if config.reshard_rate else 0
        while True:
            step = {
                "migration": migration_id,
                "cursor": cursor,
                "count": self.step_keys,
                "rate": rate,
                "busy_pct": config.reshard_busy_pct,
            }
            answer = await self._step(source, step)
            self.blocked = None
            entry["scanned"] += answer["scanned"]
            entry["moved"] += answer["moved"]
            entry["holds"] = entry.get("holds", 0) + answer.get("holds", 0)
            # Where a source's copy time goes (node/migration/copy_step.py): finding,
            # moving, pausing.
            for part in ("seconds", "find_s", "move_s", "paused_s"):
                entry[part] = round(entry.get(part, 0.0) + answer.get(part, 0.0), 3)
            self.progress["keys_moved"] += answer["moved"]
            self.moved_keys_total += answer["moved"]
            elapsed = max(time.monotonic() - started, 1e-9)
            self.progress["keys_per_s"] = round(self.progress["keys_moved"] / elapsed, 1)
            cursor = int(answer["cursor"])
            if cursor == 0:
                entry["done"] = True
                return
