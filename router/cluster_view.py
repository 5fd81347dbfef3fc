"""The router's view of the cluster: topology, one channel per node, routing."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import aiohttp

from cluster import topology as topo
from cluster.config import RouterConfig
from cluster.partition import new_partitioner
from cluster.topology import Topology
from router.dispatch import NodeChannel, NodeUnavailable

log = logging.getLogger("shardlimit.router")
MAX_MOVED_RETRIES = 3


class ClusterView:
    def __init__(self, config: RouterConfig, cluster_token: str | None) -> None:
        self.config = config
        self.cluster_token = cluster_token
        self.path = Path(config.data_dir) / "topology.json"
        self.topology = self._initial_topology()
        self.session: aiohttp.ClientSession | None = None
        self.channels: dict[str, NodeChannel] = {}
        self._pushes: dict[str, asyncio.Task[None]] = {}
        self.moved_retries = 0

    def _initial_topology(self) -> Topology:
        stored = topo.load(self.path)
        if stored is not None:
            return stored
        if not self.config.nodes:
            raise ValueError("no topology in the data dir and no nodes in the config")
        part = new_partitioner(
            self.config.partitioner, self.config.nodes, vnodes=self.config.vnodes
        )
        topology = Topology(epoch=1, partitioner=part)
        topo.save_atomic(self.path, topology)
        return topology

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=64, keepalive_timeout=30)
        self.session = aiohttp.ClientSession(connector=connector)
        self._build_channels()
        await asyncio.gather(*(self.push_topology(n) for n in self.channels))

    def _build_channels(self) -> None:
        assert self.session is not None
        for spec in self.topology.nodes:
            if spec.id in self.channels and self.channels[spec.id].spec == spec:
                continue
            self.channels[spec.id] = NodeChannel(
                spec,
                self.session,
                self.cluster_token,
                timeout_s=self.config.node_timeout_ms / 1000,
                coalesce_max=self.config.coalesce_max,
                coalesce_wait_s=self.config.coalesce_wait_us / 1_000_000,
                on_epoch=self._saw_epoch,
            )

    def _saw_epoch(self, node_id: str, epoch: int) -> None:
        if epoch < self.topology.epoch and node_id not in self._pushes:
            task = asyncio.get_running_loop().create_task(self.push_topology(node_id))
            self._pushes[node_id] = task
            task.add_done_callback(lambda _t: self._pushes.pop(node_id, None))

    async def push_topology(self, node_id: str) -> None:
        channel = self.channels[node_id]
        try:
            await channel.post("/node/v1/topology", self.topology.to_dict(), method="PUT")
        except NodeUnavailable as exc:
            log.warning(
                "could not push topology epoch %s to %s: %s", self.topology.epoch, node_id, exc
            )

    def owner(self, key: str) -> str:
        return self.topology.partitioner.owner(key)

    async def execute(self, key: str, op: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Send one op to the key's owner; follow `moved` answers. Raises NodeUnavailable."""
        for _attempt in range(MAX_MOVED_RETRIES + 1):
            node_id = self.owner(key)
            result: dict[str, Any] = await self.channels[node_id].submit(op)
            if result.get("s") != "moved":
                return node_id, result
            self.moved_retries += 1
            # The node's topology is behind ours (e.g. it restarted): bring it up to date.
            await self.push_topology(node_id)
        raise NodeUnavailable(f"key kept moving after {MAX_MOVED_RETRIES} retries")

    async def node_stats(self) -> dict[str, dict[str, Any]]:
        async def one(node_id: str) -> tuple[str, dict[str, Any]]:
            try:
                stats: dict[str, Any] = await self.channels[node_id].get("/node/v1/stats")
                return node_id, stats
            except NodeUnavailable as exc:
                return node_id, {"error": str(exc)}

        return dict(await asyncio.gather(*(one(n) for n in self.channels)))

    async def close(self) -> None:
        for channel in self.channels.values():
            await channel.close()
        for task in list(self._pushes.values()):
            task.cancel()
        if self.session is not None:
            await self.session.close()
