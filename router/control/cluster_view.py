"""The router's view of the cluster: topology, one client per node (router/channel/), routing."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from cluster import wire
from cluster.model import topology as topo
from cluster.model.nodes import NodeSpec
from cluster.model.partition import Partitioner, new_partitioner, partitioner_from_dict
from cluster.model.topology import Topology
from router.channel.node_client import NodeClient
from router.channel.op_group import OpGroup, Outcome
from router.channel.shard_client import ShardClient
from router.config import RouterConfig
from router.control.topology_sync import TopologySync
from router.errors import NodeUnavailable, Reason

MAX_MOVED_RETRIES = 5
# Owners looked up under the current topology, by key: hashing a key onto the ring
# (MD5) costs more than the rest of routing it. Emptied when it holds this many keys or
# this many characters of keys, and when the partitioner changes.
OWNER_CACHE_MAX = 1 << 17
OWNER_CACHE_CHARS = 8_000_000
# An op that expired or timed out on a node that is up was not applied: send it again,
# up to this many times, before answering degraded.
MAX_RESENDS = 3


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
        self.clients: dict[str, ShardClient] = {}  # node id -> the router's client of it
        # Clients of endpoints no longer listed: closed with the view (answers of their
        # batches in flight still arrive meanwhile).
        self._retired: list[NodeClient] = []
        self._owners: dict[str, str] = {}
        self._owners_of: Partitioner = self.topology.partitioner
        self._owner_chars = 0  # characters of the keys in _owners
        self.moved_retries = 0
        self.sync = TopologySync(self)
        # Called with each client made for a member node (router/metrics.py observes it).
        self.on_client: Callable[[ShardClient], None] | None = None

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

    async def start(self) -> None:
        self.build_clients()
        await self.sync.start()

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

    def client_for(self, spec: NodeSpec) -> ShardClient:
        """A client of `spec` (of each of its endpoints) with this router's settings.
        Raises ValueError (bad URL)."""

        def endpoint(url_spec: NodeSpec, on_state: Callable[[], None]) -> NodeClient:
            return NodeClient(
                url_spec,
                self.cluster_token,
                deadline_s=self.config.node_deadline_ms / 1000,
                margin_s=self.config.deadline_margin_ms / 1000,
                max_inflight=self.config.node_inflight,
                queue_max=self.config.node_queue_max,
                coalesce_max=self.config.coalesce_max,
                coalesce_wait_s=self.config.coalesce_wait_us / 1_000_000,
                on_epoch=self.sync.saw_epoch,
                ssl_context=self.ssl_context,
                on_state=on_state,
            )

        return ShardClient(spec, endpoint)

    def build_clients(self) -> None:
        """A client of each node of the topology (and of a running migration's previous
        layout) that has none yet; a node whose endpoints changed keeps its client, which
        takes the topology's list (a node of both layouts: the current one's)."""
        seen: set[str] = set()
        for spec in (*self.topology.nodes, *self.previous_nodes()):
            if spec.id in seen:
                continue
            seen.add(spec.id)
            client = self.clients.get(spec.id)
            if client is None:
                self.clients[spec.id] = client = self.client_for(spec)
                if self.on_client is not None:
                    self.on_client(client)
            elif client.spec != spec:
                for gone in client.respec(spec):
                    self._retired.append(gone)
                if self.on_client is not None:
                    self.on_client(client)

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
            node_id, topology.epoch, self.clients[node_id].submit(op, topology.layout_id)
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
                self.clients[node_id].submit_group([ops[i] for i in indexes], layout),
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
                and not outcome.endpoint_down
                and self.clients[node_id].state == "up"
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
            client = self.clients[node_id]
            try:
                result = await attempt.future
            except NodeUnavailable as exc:
                if exc.reason is not Reason.TIMEOUT or exc.endpoint_down or client.state != "up":
                    raise
                if resends >= MAX_RESENDS:
                    raise
                resends += 1
                continue
            if isinstance(result, wire.Expired):
                if result.unreplicated:  # sent again, it would wait for no replica again
                    raise NodeUnavailable(
                        f"node {node_id}: no replica held the check in time",
                        Reason.UNREPLICATED,
                    )
                if result.unavailable:  # the key's previous owner: this op only, node up
                    raise NodeUnavailable(
                        f"node {node_id}: {result.unavailable}", Reason.UNAVAILABLE
                    )
                client.expired += 1
                if resends >= MAX_RESENDS or client.state != "up":
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
                await self.sync.refresh_from(node_id)  # we are behind: learn the new layout
            elif self.topology.epoch == epoch:
                await self.sync.push_topology(node_id)  # the node is behind (it restarted, say)

    async def node_stats(self) -> dict[str, dict[str, Any]]:
        """Each member node's stats, or {"error": why not}."""
        return await self.sync.node_stats()

    def on_stats(self, listener: Callable[[str, dict[str, Any]], None]) -> None:
        """Call `listener(node_id, stats)` with every node's stats the epoch poll reads."""
        self.sync.on_stats(listener)

    async def close(self) -> None:
        await self.sync.close()
        for client in self.clients.values():
            await client.close()
        for endpoint in self._retired:
            await endpoint.close()


def layout_cluster_id(part: Partitioner) -> str:
    """A cluster id derived from the initial layout: routers started together from one
    config (replicas on empty data dirs) agree on it without talking to each other."""
    layout = orjson.dumps(part.to_dict(), option=orjson.OPT_SORT_KEYS)
    return "l" + hashlib.sha256(layout).hexdigest()[:15]
