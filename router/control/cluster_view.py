"""The router's view of the cluster: topology, one channel per node, routing."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from cluster import wire
from cluster.model import topology as topo
from cluster.model.nodes import NodeSpec
from cluster.model.partition import Partitioner, new_partitioner, partitioner_from_dict
from cluster.model.topology import Topology
from router.channel.node_channel import NodeChannel
from router.channel.op_group import OpGroup, Outcome
from router.config import RouterConfig
from router.errors import NodeUnavailable, Reason

log = logging.getLogger("shardlimit.router")
MAX_MOVED_RETRIES = 5
# Owners looked up under the current topology, by key: hashing a key onto the ring
# (MD5) costs more than the rest of routing it. Emptied when it holds this many keys or
# this many characters of keys, and when the partitioner changes.
OWNER_CACHE_MAX = 1 << 17
OWNER_CACHE_CHARS = 8_000_000
# An op that expired or timed out on a node that is up was not applied: send it again,
# up to this many times, before answering degraded.
MAX_RESENDS = 3
EPOCH_POLL_S = 0.5


class Attempt(NamedTuple):
    """One op queued for the node that owned its key under topology `epoch`."""

    node_id: str
    epoch: int
    future: asyncio.Future[wire.Result]


class GroupAttempt(NamedTuple):
    """Ops (their indexes in the caller's list) queued together for the node that owned
    their keys under topology `epoch`."""

    node_id: str
    epoch: int
    indexes: list[int]
    group: OpGroup


class ClusterView:
    def __init__(self, config: RouterConfig, cluster_token: str | None) -> None:
        self.config = config
        self.cluster_token = cluster_token
        # Calls to https:// nodes (None: the system's CAs, no client certificate).
        # Raises cluster.web.tls.TlsError.
        self.ssl_context = config.tls.client_context()
        self.path = Path(config.data_dir) / "topology.json"
        # fresh: the topology (or its cluster id) was made at this start, not found on disk.
        self.fresh = False
        self.topology = self._initial_topology()
        # Nodes that answer for another cluster (node id -> its cluster id): never pushed to.
        self.foreign: dict[str, str] = {}
        self.push_failures: dict[str, str] = {}  # node id -> why its last push failed
        self.channels: dict[str, NodeChannel] = {}
        self._owners: dict[str, str] = {}
        self._owners_of: Partitioner = self.topology.partitioner
        self._owner_chars = 0  # characters of the keys in _owners
        self._pushes: dict[str, asyncio.Task[bool]] = {}
        self._refresh: asyncio.Task[None] | None = None
        self._poller: asyncio.Task[None] | None = None
        self._stats_listeners: list[Callable[[str, dict[str, Any]], None]] = []
        self.moved_retries = 0
        # Called with each channel opened to a member node (router/metrics.py observes it).
        self.on_channel: Callable[[NodeChannel], None] | None = None

    def _initial_topology(self) -> Topology:
        stored = topo.load(self.path)
        if stored is not None:
            if stored.cluster_id is None:  # kept by a version without cluster ids
                # Derived from the layout: the cluster's other routers derive the same.
                cluster_id = layout_cluster_id(stored.partitioner)
                stored = dataclasses.replace(stored, cluster_id=cluster_id)
                topo.save_atomic(self.path, stored)
                self.fresh = True  # a guess: the id the nodes already hold wins
            return stored
        if not self.config.nodes:
            raise ValueError("no topology in the data dir and no nodes in the config")
        part = new_partitioner(
            self.config.partitioner, self.config.nodes, vnodes=self.config.vnodes
        )
        cluster_id = self.config.cluster_id or layout_cluster_id(part)
        topology = Topology(epoch=1, partitioner=part, cluster_id=cluster_id)
        topo.save_atomic(self.path, topology)
        self.fresh = True
        return topology

    def _join_existing(self, theirs: Topology) -> bool:
        """A router started on an empty data dir (routers are stateless), whose nodes
        already form a cluster: take that cluster's topology rather than push its own."""
        if not self.fresh or theirs.cluster_id is None:
            return False
        topo.save_atomic(self.path, theirs)
        self.topology = theirs
        self.fresh = False
        self.foreign.clear()
        self._build_channels()
        log.info("joined cluster %s at epoch %d", theirs.cluster_id, theirs.epoch)
        return True

    async def start(self) -> None:
        self._build_channels()
        # Another router may have moved the cluster on while we were down.
        await self.refresh_from_nodes()
        self.fresh = False
        await asyncio.gather(*(self.push_topology(n) for n in self.member_ids()))
        self._poller = asyncio.get_running_loop().create_task(self._poll_epochs())

    def member_ids(self) -> list[str]:
        """Nodes of the topology, plus those a running migration moves keys away from."""
        ids = [n.id for n in self.topology.nodes]
        for spec in self.previous_nodes():
            if spec.id not in ids:
                ids.append(spec.id)
        return ids

    def previous_nodes(self) -> tuple[NodeSpec, ...]:
        migration = self.topology.migration
        if not migration or not isinstance(migration.get("from"), dict):
            return ()
        return partitioner_from_dict(migration["from"]).nodes

    def channel_for(self, spec: NodeSpec) -> NodeChannel:
        """A channel to `spec` with this router's settings. Raises ValueError (bad URL)."""
        return NodeChannel(
            spec,
            self.cluster_token,
            deadline_s=self.config.node_deadline_ms / 1000,
            margin_s=self.config.deadline_margin_ms / 1000,
            max_inflight=self.config.node_inflight,
            queue_max=self.config.node_queue_max,
            coalesce_max=self.config.coalesce_max,
            coalesce_wait_s=self.config.coalesce_wait_us / 1_000_000,
            on_epoch=self._saw_epoch,
            ssl_context=self.ssl_context,
        )

    def _build_channels(self) -> None:
        for spec in (*self.topology.nodes, *self.previous_nodes()):
            if spec.id in self.channels and self.channels[spec.id].spec == spec:
                continue
            self.channels[spec.id] = self.channel_for(spec)
            if self.on_channel is not None:
                self.on_channel(self.channels[spec.id])

    def adopt(self, topology: Topology) -> bool:
        """Take a newer topology of this cluster: persist it, open channels to new nodes."""
        if topology.cluster_id != self.topology.cluster_id and self._join_existing(topology):
            return True
        if topology.epoch <= self.topology.epoch:
            return False
        if topology.cluster_id != self.topology.cluster_id:
            log.error(
                "ignored topology epoch %d of cluster %s (this is cluster %s)",
                topology.epoch,
                topology.cluster_id,
                self.topology.cluster_id,
            )
            return False
        topo.save_atomic(self.path, topology)
        self.topology = topology
        self._build_channels()
        log.info("topology epoch %d adopted", topology.epoch)
        return True

    def _saw_epoch(self, node_id: str, epoch: int) -> None:
        if epoch > self.topology.epoch:
            self._schedule_refresh(node_id)
        elif epoch < self.topology.epoch and node_id not in self._pushes:
            task = asyncio.get_running_loop().create_task(self.push_topology(node_id))
            self._pushes[node_id] = task
            task.add_done_callback(lambda _t: self._pushes.pop(node_id, None))

    def _schedule_refresh(self, node_id: str) -> None:
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.get_running_loop().create_task(self.refresh_from(node_id))

    async def refresh_from(self, node_id: str) -> None:
        try:
            data = await self.channels[node_id].get(wire.TOPOLOGY_PATH, timeout_s=1.0)
            self.adopt(Topology.from_dict(data))
        except (NodeUnavailable, ValueError, KeyError, TypeError) as exc:
            log.warning("could not fetch the topology from %s: %s", node_id, exc)

    async def _node_epoch(self, node_id: str) -> int:
        """A node's epoch from its stats (which also tell its liveness port).
        Raises NodeUnavailable."""
        channel = self.channels[node_id]
        stats = await channel.get(wire.STATS_PATH, timeout_s=1.0)
        channel.learn_liveness_port(stats.get("live"))
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

        found = await asyncio.gather(*(epoch_of(n) for n in list(self.channels)))
        if self.fresh:
            for _epoch, node_id in sorted(found, reverse=True):
                if node_id in self.foreign:
                    await self.refresh_from(node_id)  # joins it if it is this cluster
                    break
        epoch, node_id = max(found, default=(0, ""))
        if epoch > self.topology.epoch:
            await self.refresh_from(node_id)

    def _note_cluster(self, node_id: str, cluster_id: Any) -> None:
        if isinstance(cluster_id, str) and cluster_id != self.topology.cluster_id:
            if self.foreign.get(node_id) != cluster_id:
                log.error(
                    "node %s answers for cluster %s, not this cluster %s: "
                    "no topology is pushed to it",
                    node_id,
                    cluster_id,
                    self.topology.cluster_id,
                )
            self.foreign[node_id] = cluster_id
        else:
            self.foreign.pop(node_id, None)

    async def _poll_epochs(self) -> None:
        """A second router learns of a change within a second even if idle."""
        turn = 0
        while True:
            await asyncio.sleep(EPOCH_POLL_S)  # polling cadence
            ids = self.member_ids()
            node_id = ids[turn % len(ids)]
            turn += 1
            with contextlib.suppress(NodeUnavailable, ValueError, TypeError):
                if await self._node_epoch(node_id) > self.topology.epoch:
                    await self.refresh_from(node_id)

    def lock_node(self) -> str:
        """The node whose Redis holds the change leases: the first member by id."""
        return min({n.id for n in self.topology.nodes} | {n.id for n in self.previous_nodes()})

    async def lease(self, name: str, action: str, token: str, ttl_ms: int) -> bool:
        """Acquire, renew or release the change lease `name` ("topology" or "rules")
        for `token`: whether it is held afterwards. Raises NodeUnavailable."""
        payload = {"name": name, "action": action, "token": token, "ttl_ms": ttl_ms}
        answer = await self.channels[self.lock_node()].post(wire.LEASE_PATH, payload, timeout_s=5.0)
        return bool(answer.get("held"))

    def on_stats(self, listener: Callable[[str, dict[str, Any]], None]) -> None:
        """Call `listener(node_id, stats)` with every node's stats the poll reads."""
        self._stats_listeners.append(listener)

    async def push_topology(self, node_id: str) -> bool:
        channel = self.channels[node_id]
        if node_id in self.foreign:
            self.push_failures[node_id] = (
                f"node {node_id} answers for another cluster ({self.foreign[node_id]})"
            )
            return False
        try:
            await channel.post(
                wire.TOPOLOGY_PATH, self.topology.to_dict(), method="PUT", timeout_s=10.0
            )
        except NodeUnavailable as exc:
            log.warning(
                "could not push topology epoch %s to %s: %s", self.topology.epoch, node_id, exc
            )
            self.push_failures[node_id] = str(exc)
            return False
        self.push_failures.pop(node_id, None)
        return True

    def _owner_cache(self, room: int = 1) -> dict[str, str]:
        """The owners cache with room for `room` more keys, emptied when the partitioner
        changed or it is full."""
        partitioner = self.topology.partitioner
        if (
            partitioner is not self._owners_of
            or len(self._owners) + room > OWNER_CACHE_MAX
            or self._owner_chars > OWNER_CACHE_CHARS
        ):
            self._owners = {}
            self._owners_of = partitioner
            self._owner_chars = 0
        return self._owners

    def owner(self, key: str) -> str:
        owners = self._owner_cache()
        node_id = owners.get(key)
        if node_id is None:
            node_id = owners[key] = self._owners_of.owner(key)
            self._owner_chars += len(key)
        return node_id

    def send(self, key: str, op: wire.Op) -> Attempt:
        """Queue `op` for the key's owner now; its answer comes in the attempt's future."""
        node_id = self.owner(key)
        topology = self.topology
        return Attempt(
            node_id, topology.epoch, self.channels[node_id].submit(op, topology.layout_id)
        )

    def send_many(self, keys: list[str], ops: list[wire.Op]) -> list[GroupAttempt]:
        """Queue `ops[i]` for the owner of `keys[i]` now, one OpGroup per node."""
        owners = self._owner_cache(len(keys))
        owner = self._owners_of.owner
        by_node: dict[str, list[int]] = {}
        for index, key in enumerate(keys):
            node_id = owners.get(key)
            if node_id is None:
                node_id = owners[key] = owner(key)
                self._owner_chars += len(key)
            indexes = by_node.get(node_id)
            if indexes is None:
                by_node[node_id] = [index]
            else:
                indexes.append(index)
        epoch, layout = self.topology.epoch, self.topology.layout_id
        return [
            GroupAttempt(
                node_id,
                epoch,
                indexes,
                self.channels[node_id].submit_group([ops[i] for i in indexes], layout),
            )
            for node_id, indexes in by_node.items()
        ]

    def settled(self, attempt: Attempt) -> bool:
        """The attempt has an outcome `execute` would not send again."""
        future = attempt.future
        if not future.done():
            return False
        failure = future.exception()
        return self.settled_outcome(attempt.node_id, failure or future.result())

    def settled_outcome(self, node_id: str, outcome: Outcome) -> bool:
        """An outcome from `node_id` that `execute` would not send again: no move, no
        expiry, no timeout of a node that is still up."""
        if isinstance(outcome, BaseException):
            return not (
                isinstance(outcome, NodeUnavailable)
                and outcome.reason is Reason.TIMEOUT
                and self.channels[node_id].state == "up"
            )
        return not isinstance(outcome, wire.Moved | wire.Expired)

    async def execute(
        self, key: str, op: wire.Op, first: Attempt | None = None
    ) -> tuple[str, wire.Result]:
        """Send one op to the key's owner (or take `first`, already sent); follow `moved`
        answers and send again an op the node did not apply in time (expired, or no
        answer by the deadline plus the margin) while the node is up. Raises
        NodeUnavailable."""
        moves = resends = 0
        while True:
            attempt, first = first or self.send(key, op), None
            node_id, epoch = attempt.node_id, attempt.epoch
            channel = self.channels[node_id]
            try:
                result = await attempt.future
            except NodeUnavailable as exc:
                if exc.reason is not Reason.TIMEOUT or channel.state != "up":
                    raise
                if resends >= MAX_RESENDS:
                    raise
                resends += 1
                continue
            if isinstance(result, wire.Expired):
                channel.expired += 1
                if resends >= MAX_RESENDS or channel.state != "up":
                    raise NodeUnavailable(
                        f"node {node_id}: deadline passed before the op could run", Reason.EXPIRED
                    )
                resends += 1
                continue
            if not isinstance(result, wire.Moved):
                return node_id, result
            self.moved_retries += 1
            moves += 1
            if moves > MAX_MOVED_RETRIES:
                raise NodeUnavailable(f"key kept moving after {MAX_MOVED_RETRIES} retries")
            if result.epoch > epoch:
                await self.refresh_from(node_id)  # we are behind: learn the new layout
            elif self.topology.epoch == epoch:
                await self.push_topology(node_id)  # the node is behind (e.g. it restarted)

    async def node_stats(self) -> dict[str, dict[str, Any]]:
        async def one(node_id: str) -> tuple[str, dict[str, Any]]:
            try:
                stats: dict[str, Any] = await self.channels[node_id].get(wire.STATS_PATH)
                return node_id, stats
            except NodeUnavailable as exc:
                return node_id, {"error": str(exc)}

        return dict(await asyncio.gather(*(one(n) for n in self.member_ids())))

    async def close(self) -> None:
        for task in (self._poller, self._refresh, *self._pushes.values()):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for channel in self.channels.values():
            await channel.close()


def layout_cluster_id(part: Partitioner) -> str:
    """A cluster id derived from the initial layout: routers started together from one
    config (replicas on empty data dirs) agree on it without talking to each other."""
    layout = orjson.dumps(part.to_dict(), option=orjson.OPT_SORT_KEYS)
    return "l" + hashlib.sha256(layout).hexdigest()[:15]
