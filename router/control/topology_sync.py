"""Keeping the router's topology in step with the nodes': adopting newer ones, pushing
it to nodes behind, polling their epochs, and the change leases kept on the lock node.
Works on the cluster view (router/control/cluster_view.py), which routes with it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from cluster import wire
from cluster.model import topology as topo
from cluster.model.nodes import NodeSpec
from cluster.model.topology import Topology
from router.channel.background import cancel
from router.channel.node_client import NodeClient
from router.channel.shard_client import ShardClient, unanswered
from router.errors import NodeUnavailable

log = logging.getLogger("shardlimit.router")
EPOCH_POLL_S = 0.5
PUSH_TIMEOUT_S = 10.0  # one push of a topology to one node
# How long a change pushes its topology to the members before it pauses, naming a node
# that did not take it: the change's request answers within it.
ANNOUNCE_S = 20.0
ROUND_S = 0.5  # between rounds of pushes


class View(Protocol):
    """What the sync reads and changes of the cluster view."""

    path: Path  # where the topology is kept
    topology: Topology
    # The topology was made at this start, not found on disk.
    fresh: bool
    clients: dict[str, ShardClient]

    def member_ids(self) -> list[str]: ...

    def previous_nodes(self) -> tuple[NodeSpec, ...]: ...

    def build_clients(self) -> None: ...


class TopologySync:
    def __init__(self, view: View) -> None:
        self.view = view
        # Nodes that answer for another cluster (node id -> its cluster id): never pushed to.
        self.foreign: dict[str, str] = {}
        self.push_failures: dict[str, str] = {}  # node id -> why its last push failed
        self._pushes: dict[str, asyncio.Task[bool]] = {}
        self._refresh: asyncio.Task[None] | None = None
        self.poller: asyncio.Task[None] | None = None
        self._stats_listeners: list[Callable[[str, dict[str, Any]], None]] = []

    async def start(self) -> None:
        view = self.view
        # Another router may have moved the cluster on while we were down.
        await self.refresh_from_nodes()
        view.fresh = False
        await asyncio.gather(*(self.push_topology(n) for n in view.member_ids()))
        self.poller = asyncio.get_running_loop().create_task(self._poll_epochs())

    def _join_existing(self, theirs: Topology) -> bool:
        """A router started on an empty data dir (routers are stateless), whose nodes
        already form a cluster: take that cluster's topology rather than push its own."""
        view = self.view
        if not view.fresh or theirs.cluster_id is None:
            return False
        topo.save_atomic(view.path, theirs)
        view.topology = theirs
        view.fresh = False
        self.foreign.clear()
        view.build_clients()
        log.info("joined cluster %s at epoch %d", theirs.cluster_id, theirs.epoch)
        return True

    def adopt(self, topology: Topology) -> bool:
        """Take a newer topology of this cluster: persist it, make clients of new nodes."""
        view = self.view
        if topology.cluster_id != view.topology.cluster_id and self._join_existing(topology):
            return True
        if topology.epoch <= view.topology.epoch:
            return False
        if topology.cluster_id != view.topology.cluster_id:
            log.error(
                "ignored topology epoch %d of cluster %s (this is cluster %s)",
                topology.epoch,
                topology.cluster_id,
                view.topology.cluster_id,
            )
            return False
        topo.save_atomic(view.path, topology)
        view.topology = topology
        view.build_clients()
        log.info("topology epoch %d adopted", topology.epoch)
        return True

    def saw_epoch(self, node_id: str, epoch: int) -> None:
        """A node answered a batch at `epoch`: learn from it, or bring it up to date."""
        if epoch > self.view.topology.epoch:
            self._schedule_refresh(node_id)
        elif epoch < self.view.topology.epoch and node_id not in self._pushes:
            task = asyncio.get_running_loop().create_task(self.push_topology(node_id))
            self._pushes[node_id] = task
            task.add_done_callback(lambda _t: self._pushes.pop(node_id, None))

    def _schedule_refresh(self, node_id: str) -> None:
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.get_running_loop().create_task(self.refresh_from(node_id))

    async def refresh_from(self, node_id: str) -> None:
        try:
            data = await self.view.clients[node_id].get(wire.TOPOLOGY_PATH, timeout_s=1.0)
            self.adopt(Topology.from_dict(data))
        except (NodeUnavailable, ValueError, KeyError, TypeError) as exc:
            log.warning("could not fetch the topology from %s: %s", node_id, exc)

    async def _node_epoch(self, node_id: str) -> int:
        """A node's epoch from its stats; each of its endpoints learns its liveness port
        on the way. Raises NodeUnavailable."""
        client = self.view.clients[node_id]
        stats = await client.get(wire.EPOCH_STATS_PATH, timeout_s=1.0)
        await client.learn_liveness_ports()
        self._note_cluster(node_id, stats.get("cluster_id"))
        for listener in self._stats_listeners:
            listener(node_id, stats)
        return int(stats.get("epoch", 0))

    async def refresh_from_nodes(self) -> None:
        async def epoch_of(node_id: str) -> tuple[int, str]:
            try:
                return await self._node_epoch(node_id), node_id
            except (NodeUnavailable, ValueError, TypeError):
                return 0, node_id

        found = await asyncio.gather(*(epoch_of(n) for n in list(self.view.clients)))
        if self.view.fresh:
            for _epoch, node_id in sorted(found, reverse=True):
                if node_id in self.foreign:
                    await self.refresh_from(node_id)  # joins it if it is this cluster
                    break
        epoch, node_id = max(found, default=(0, ""))
        if epoch > self.view.topology.epoch:
            await self.refresh_from(node_id)

    def _note_cluster(self, node_id: str, cluster_id: Any) -> None:
        ours = self.view.topology.cluster_id
        if isinstance(cluster_id, str) and cluster_id != ours:
            if self.foreign.get(node_id) != cluster_id:
                log.error(
                    "node %s answers for cluster %s, not this cluster %s: "
                    "no topology is pushed to it",
                    node_id,
                    cluster_id,
                    ours,
                )
            self.foreign[node_id] = cluster_id
        else:
            self.foreign.pop(node_id, None)

    async def _poll_epochs(self) -> None:
        """A second router learns of a change within a second even if idle, and a node
        behind (a push it refused or never got) is pushed the topology again."""
        turn = 0
        while True:
            await asyncio.sleep(EPOCH_POLL_S)  # polling cadence
            ids = self.view.member_ids()
            node_id = ids[turn % len(ids)]
            turn += 1
            with contextlib.suppress(NodeUnavailable, ValueError, TypeError):
                epoch = await self._node_epoch(node_id)
                if epoch > self.view.topology.epoch:
                    await self.refresh_from(node_id)
                else:
                    self.saw_epoch(node_id, epoch)

    def lock_node(self) -> str:
        """The node whose Redis holds the change leases: the first member by id."""
        view = self.view
        return min({n.id for n in view.topology.nodes} | {n.id for n in view.previous_nodes()})

    async def lease(self, name: str, action: str, token: str, ttl_ms: int) -> bool:
        """Acquire, renew or release the change lease `name` ("topology" or "rules")
        for `token`: whether it is held afterwards. Raises NodeUnavailable."""
        payload = {"name": name, "action": action, "token": token, "ttl_ms": ttl_ms}
        lock = self.view.clients[self.lock_node()]
        answer = await lock.post(wire.LEASE_PATH, payload, timeout_s=5.0)
        return bool(answer.get("held"))

    def on_stats(self, listener: Callable[[str, dict[str, Any]], None]) -> None:
        """Call `listener(node_id, stats)` with every node's stats the poll reads."""
        self._stats_listeners.append(listener)

    async def push_everywhere(
        self, on_blocked: Callable[[dict[str, str]], None]
    ) -> dict[str, str] | None:
        """Push the topology to every member until all took it, in rounds ROUND_S apart
        for ANNOUNCE_S at most: None, or {"node", "reason"} of one that did not take it
        (also given to `on_blocked` after each round that left one behind)."""
        ids = self.view.member_ids()
        epoch = self.view.topology.epoch
        deadline = time.monotonic() + ANNOUNCE_S
        while True:
            wait_s = min(PUSH_TIMEOUT_S, max(deadline - time.monotonic(), ROUND_S))
            results = await asyncio.gather(*(self.push_topology(n, wait_s) for n in ids))
            if all(results):
                return None
            failed = next(n for n, ok in zip(ids, results, strict=True) if not ok)
            why = self.push_failures.get(failed, "no answer")
            blocked = {"node": failed, "reason": f"epoch {epoch} not taken: {why}"}
            on_blocked(blocked)
            if time.monotonic() + ROUND_S >= deadline:
                return blocked
            await asyncio.sleep(ROUND_S)  # retry cadence while a node is unreachable

    async def push_topology(self, node_id: str, timeout_s: float = PUSH_TIMEOUT_S) -> bool:
        view = self.view
        client = view.clients[node_id]
        if node_id in self.foreign:
            self.push_failures[node_id] = (
                f"node {node_id} answers for another cluster ({self.foreign[node_id]})"
            )
            return False
        # Every endpoint of the shard takes it, but one marked down: a shard's Redis keeps
        # the newest epoch, and an endpoint behind it applies nothing until it took the
        # topology the Redis keeps (node/topology/kept.py).
        body = view.topology.to_dict()
        endpoints = [e for e in client.each() if e.state == "up"] or [client.active]

        async def push(endpoint: NodeClient) -> NodeUnavailable | None:
            try:
                await endpoint.post(wire.TOPOLOGY_PATH, body, method="PUT", timeout_s=timeout_s)
            except NodeUnavailable as exc:
                return exc
            return None

        errors = await asyncio.gather(*(push(e) for e in endpoints))
        if any(error is None for error in errors):
            # Taken by the shard: an endpoint that gave no answer (unreachable, or hung) is
            # down, and takes the topology the shard's Redis keeps before it serves again.
            # Nothing it still has in flight is waited for: the epoch the taking endpoint
            # raised in the shard's Redis refuses every op of an older one.
            for endpoint, error in zip(endpoints, errors, strict=True):
                if error is not None and unanswered(error):
                    endpoint.watchdog.mark_down(str(error))
            errors = [e for e in errors if e is None or not unanswered(e)]
        failed = [error for error in errors if error is not None]
        if failed:
            epoch = view.topology.epoch
            log.warning("could not push topology epoch %s to %s: %s", epoch, node_id, failed[0])
            self.push_failures[node_id] = str(failed[0])
            return False
        self.push_failures.pop(node_id, None)
        return True

    async def node_stats(self) -> dict[str, dict[str, Any]]:
        async def one(node_id: str) -> tuple[str, dict[str, Any]]:
            try:
                stats: dict[str, Any] = await self.view.clients[node_id].get(wire.STATS_PATH)
                return node_id, stats
            except NodeUnavailable as exc:
                return node_id, {"error": str(exc)}

        return dict(await asyncio.gather(*(one(n) for n in self.view.member_ids())))

    async def close(self) -> None:
        for task in (self.poller, self._refresh, *self._pushes.values()):
            await cancel(task)
