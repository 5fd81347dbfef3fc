"""Several endpoints of one shard for the tests: node processes of one node id on one
Redis, topologies pushed to each as a router pushes them, batches sent as a router sends
them (over HTTP, or a frame on the hot-path channel)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from cluster import wire
from cluster.local.cluster import node_process
from cluster.local.procs import ChildProcess
from cluster.local.redis_proc import RedisProcess, free_port
from cluster.model.nodes import NodeSpec
from cluster.model.partition import RingPartitioner
from cluster.model.topology import Topology
from cluster.web.auth import CLUSTER_TOKEN_ENV

CLUSTER = "endpoints-cluster-token"
HEADERS = {"Authorization": f"Bearer {CLUSTER}"}
NODE_ID = "n1"


class Shard:
    """One node id served by `endpoints` (node processes) on one Redis."""

    def __init__(self, redis: RedisProcess, endpoints: list[ChildProcess], urls: list[str]):
        self.redis = redis
        self.endpoints = endpoints
        self.urls = urls
        self.http = aiohttp.ClientSession()

    def topology(self, epoch: int, migration: str | None = None) -> Topology:
        """The shard alone in a cluster, with every endpoint listed: it owns every key.
        With `migration`, in a migration of that id (from the same layout)."""
        spec = NodeSpec(NODE_ID, self.urls[0], more_urls=tuple(self.urls[1:]))
        ring = RingPartitioner([spec])
        moving = {"id": migration, "from": ring.to_dict()} if migration else None
        return Topology(epoch, ring, moving, cluster_id="c-endpoints")

    async def push(self, url: str, epoch: int, migration: str | None = None) -> tuple[int, Any]:
        topology = self.topology(epoch, migration)
        async with self.http.put(
            url + wire.TOPOLOGY_PATH, json=topology.to_dict(), headers=HEADERS
        ) as resp:
            return resp.status, await resp.json()

    async def post(self, url: str, path: str, body: Any) -> tuple[int, Any]:
        async with self.http.post(url + path, json=body, headers=HEADERS) as resp:
            return resp.status, await resp.json()

    async def stats(self, url: str) -> dict[str, Any]:
        async with self.http.get(url + wire.STATS_PATH, headers=HEADERS) as resp:
            assert resp.status == 200, await resp.text()
            body: dict[str, Any] = await resp.json()
            return body

    async def batch(self, url: str, ops: list[wire.Op]) -> wire.BatchReply:
        """A batch over HTTP (wire.BATCH_PATH)."""
        batch = wire.Batch(int(time.time() * 1000) + 5000, ops)
        async with self.http.post(
            url + wire.BATCH_PATH,
            data=wire.encode(batch),
            headers={**HEADERS, "Content-Type": wire.CONTENT_TYPE},
        ) as resp:
            assert resp.status == 200, await resp.text()
            return wire.decode_reply(await resp.read())

    async def channel_batch(self, url: str, ops: list[wire.Op], layout: int) -> wire.BatchReply:
        """A batch as one frame on the endpoint's hot-path channel."""
        async with self.http.get(url + wire.HEALTH_PATH) as resp:
            port = (await resp.json())["channel"]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(wire.frame(wire.Hello(CLUSTER)))
            assert isinstance(await _read_frame(reader), wire.Welcome)
            deadline = int(time.time() * 1000) + 5000
            writer.write(wire.frame(wire.Request(1, deadline, ops, layout)))
            reply = await _read_frame(reader)
            assert isinstance(reply, wire.Reply) and reply.status == 200, reply
            assert reply.reply is not None
            return reply.reply
        finally:
            writer.close()
            await writer.wait_closed()

    async def close(self) -> None:
        await self.http.close()


async def _read_frame(reader: asyncio.StreamReader) -> wire.ChannelOut:
    (length,) = wire.FRAME_HEADER.unpack(await reader.readexactly(wire.FRAME_HEADER.size))
    return wire.decode_channel_out(await reader.readexactly(length))


@asynccontextmanager
async def shard_endpoints(redis: RedisProcess, logs: Path, count: int = 2) -> AsyncIterator[Shard]:
    """`count` node processes of NODE_ID on `redis`, stopped on the way out."""
    env = {**os.environ, CLUSTER_TOKEN_ENV: CLUSTER}
    endpoints: list[ChildProcess] = []
    urls: list[str] = []
    for i in range(count):
        port = free_port()
        log = logs / f"endpoint-{i}.log"
        endpoints.append(node_process(NODE_ID, port, redis.url, log=log, env=env))
        urls.append(f"http://127.0.0.1:{port}")
    shard = Shard(redis, endpoints, urls)
    try:
        await asyncio.gather(*(endpoint.start_async() for endpoint in endpoints))
        yield shard
    finally:
        await shard.close()
        for endpoint in endpoints:
            endpoint.stop()
