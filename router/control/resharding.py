"""The orchestrator of a live reshard (docs/resharding.md), run inside a router."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from cluster import wire
from cluster.model.nodes import NodeSpec
from cluster.model.partition import Partitioner, partitioner_from_dict
from cluster.model.topology import Topology
from router.control.cluster_view import ClusterView
from router.control.migration_steps import MigrationSteps
from router.control.topology_lease import TopologyLease
from router.errors import MigrationBlocked, NodeUnavailable, ReshardError

log = logging.getLogger("shardlimit.reshard")
# The nodes a migration leads to, from the current ones (raises ReshardError).
Change = Callable[[list[NodeSpec]], list[NodeSpec]]


class Resharder:
    """Serialised by a lease; one migration at a time; resumable from the topology."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view
        # A crashed orchestrator blocks a new one at most one lease TTL.
        self.lease = TopologyLease(view.sync, view.config.reshard_lease_ttl_ms)
        self.step_keys = view.config.reshard_step_keys
        self.task: asyncio.Task[None] | None = None
        self.progress: dict[str, Any] = {}
        self.last_error: str | None = None
        # Why the migration cannot go on right now: {"node", "reason"} (None: it can).
        self.blocked: dict[str, str] | None = None
        self.announced = asyncio.Event()  # the migrating topology reached every node
        self.moved_keys_total = 0  # over every migration this router ran, for /metrics
        self.steps = MigrationSteps(view, self)
        # The topology lease is per router (one token): it keeps changes through different
        # routers apart, this keeps apart the changes asked of this one.
        self._changing = asyncio.Lock()

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def plan(self, nodes: Sequence[NodeSpec]) -> tuple[Partitioner, list[dict[str, Any]]]:
        current = self.view.topology.partitioner
        new = current.resized(nodes)
        return new, [m.to_dict() for m in current.plan(new)]

    def status(self) -> dict[str, Any] | None:
        topology = self.view.topology
        migration = topology.migration
        current = migration or topology.last_migration
        # This router's own figures, when they are of that migration: another router may
        # have run it, or one after this router's last (the topology keeps its summary).
        ours = self.progress if current is None or self.progress.get("id") == current["id"] else {}
        if migration is None and not ours:
            if current is None:
                return None
            return {**current, "running": False, "last_error": None, "blocked": None}
        out = dict(ours)
        if migration is not None:
            out["id"] = migration.get("id")
            out.setdefault("phase", "copying")
            if migration.get("reverts"):
                out["reverts"] = migration["reverts"]
        out["running"] = self.running
        out["last_error"] = self.last_error if ours else None
        out["blocked"] = self.blocked if ours else None
        return out

    async def start(self, change: Change) -> dict[str, Any]:
        """Begin a migration to `change(the current nodes)`, computed under the lease
        from the layout the nodes hold (another router may have changed it since this
        one last looked); returns once every node took the migrating topology. Raises
        ReshardError (refused: nothing changed) or MigrationBlocked (the topology changed
        but could not reach every node: see `abort`)."""
        async with self._changing:
            return await self._start(change)

    async def abort(self) -> dict[str, Any]:
        """Undo the migration in progress: a migration back to the previous layout, which
        hands back the keys already copied (node/migration/migrator.py). Returns once every node
        took it; raises ReshardError (nothing to abort) or MigrationBlocked."""
        async with self._changing:
            return await self._abort()

    async def _start(self, change: Change) -> dict[str, Any]:
        if self.running or self.view.topology.migration is not None:
            raise ReshardError("a migration is already in progress; see GET /v1/cluster")
        await self.lease.act("acquire")
        try:
            await self.view.sync.refresh_from_nodes()
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
                await self.lease.act("release")
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
        self.view.sync.adopt(migrating)
        await self._launch_announced()
        return {"epoch": migrating.epoch, "migration": migration["id"], "moves": moves}

    async def _abort(self) -> dict[str, Any]:
        asked = abortable(self.view.topology)["id"]
        await self._cancel()
        await self.lease.acquire_patiently()
        # Another router may have run the migration to its end (or undone it) while this
        # one waited for the lease: undo only what the nodes show now.
        try:
            await self.view.sync.refresh_from_nodes()
            migration = still_abortable(self.view.topology, asked)
        except BaseException:
            with contextlib.suppress(ReshardError):
                await self.lease.act("release")
            raise
        reverting = going_back(self.view.topology, migration)
        back = reverting.migration
        assert back is not None
        self.view.sync.adopt(reverting)
        log.warning("migration %s aborted: %s hands its keys back", asked, back["id"])
        await self._launch_announced()
        return {"epoch": reverting.epoch, "migration": back["id"], "reverts": asked}

    async def resume(self) -> dict[str, Any]:
        """Run the migration here, unless another router runs it (then ReshardError)."""
        migration = self.view.topology.migration
        if migration is None:
            raise ReshardError("no migration to resume", "nothing-to-resume")
        if not self.running:
            await self.lease.take_over()
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
        migration = self.view.topology.migration
        if migration is not None and self.progress.get("id") != migration["id"]:
            self.progress = {"id": migration["id"], "phase": "announcing"}  # ours from now
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

    async def _run(self) -> None:
        try:
            await self.lease.acquire_patiently()
            # Another router may have finished it while this one waited for the lease.
            await self.view.sync.refresh_from_nodes()
            if self.view.topology.migration is None:
                log.info("the migration was finished by another router meanwhile")
                return
            await self.lease.run_holding(self._migrate())
        except (ReshardError, NodeUnavailable) as exc:
            self.last_error = str(exc)
            self.progress["phase"] = "paused"
            log.error("migration paused (run `shardlimit reshard resume`): %s", exc)
        finally:
            with contextlib.suppress(ReshardError):
                await self.lease.act("release")

    async def _push_all(self) -> None:
        def note(blocked: dict[str, str]) -> None:
            self.blocked = blocked

        blocked = await self.view.sync.push_everywhere(note)
        self.blocked = blocked
        if blocked is not None:
            raise ReshardError(f"node {blocked['node']}: {blocked['reason']}")

    async def _migrate(self) -> None:
        topology = self.view.topology
        migration = topology.migration
        assert migration is not None
        previous = partitioner_from_dict(migration["from"])
        self.progress = {
            "id": migration["id"],
            "phase": "announcing",
            "epoch": topology.epoch,
            "sources": {
                n.id: {"scanned": 0, "moved": 0, "copying": False, "done": False}
                for n in previous.nodes
            },
            "keys_moved": 0,
            "keys_per_s": 0.0,
        }
        if migration.get("reverts"):
            self.progress["reverts"] = migration["reverts"]
        await self._push_all()
        self.announced.set()
        self.progress["phase"] = "copying"
        started = time.monotonic()
        await self.steps.copy(migration["id"], previous)
        elapsed = max(time.monotonic() - started, 1e-9)
        self.progress["keys_per_s"] = round(self.progress["keys_moved"] / elapsed, 1)
        self.progress["seconds"] = round(elapsed, 3)
        self.progress["phase"] = "finalizing"
        successors = await self.steps.hand_over_decisions(previous)
        epoch = self.view.topology.epoch + 1
        summary = {**self.progress, "phase": "done", "epoch": epoch}
        final = dataclasses.replace(
            self.view.topology,
            epoch=epoch,
            migration=None,
            successors=successors,
            last_migration=summary,
        )
        # Push to every node of the migration (removed nodes learn they own nothing).
        members = self.view.member_ids()
        self.view.sync.adopt(final)
        for node_id in members:
            await self.view.sync.push_topology(node_id)
        ids = [migration["id"], *([migration["reverts"]] if migration.get("reverts") else [])]
        for node_id in members:
            for migration_id in ids:
                with contextlib.suppress(NodeUnavailable):  # markers also expire on their own
                    await self.view.clients[node_id].post(
                        wire.MIGRATION_CLEANUP_PATH, {"migration": migration_id}, timeout_s=30.0
                    )
        self.progress["phase"] = "done"
        self.progress["epoch"] = final.epoch
        log.info("migration %s done: %d keys moved", migration["id"], self.progress["keys_moved"])


def abortable(topology: Topology) -> dict[str, Any]:
    """The migration `topology` is in, if an abort can undo it; raises ReshardError."""
    migration = topology.migration
    if migration is None:
        raise ReshardError("no migration to abort", "nothing-to-abort")
    if migration.get("reverts"):
        raise ReshardError(
            f"migration {migration['id']} already undoes {migration['reverts']}; "
            "finish it with `shardlimit reshard resume`"
        )
    return migration


def still_abortable(current: Topology, asked: str) -> dict[str, Any]:
    """Migration `asked`, if `current` is still in it; raises ReshardError."""
    if current.migration is None:
        raise ReshardError(
            f"migration {asked} finished meanwhile (epoch {current.epoch}): nothing to abort",
            "nothing-to-abort",
        )
    migration = abortable(current)
    if migration["id"] != asked:
        raise ReshardError(
            f"migration {asked} is over: the cluster is at epoch {current.epoch} "
            f"with migration {migration['id']}",
            "nothing-to-abort",
        )
    return migration


def going_back(current: Topology, migration: dict[str, Any]) -> Topology:
    """The next topology: a migration back to the layout `migration` started from."""
    back = {
        "id": uuid.uuid4().hex[:12],
        "from": current.partitioner.to_dict(),
        "reverts": migration["id"],
        "started": time.time(),
    }
    return dataclasses.replace(
        current,
        epoch=current.epoch + 1,
        partitioner=partitioner_from_dict(migration["from"]),
        migration=back,
    )
