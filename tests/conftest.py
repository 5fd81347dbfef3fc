"""Fixtures: real redis-server processes on free ports, real node and router HTTP servers."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis
import redis.asyncio as aioredis
from aiohttp import web

from cluster import wire
from cluster.local.ports import PORT_RANGE_ENV
from cluster.local.redis_proc import RedisProcess, free_port
from cluster.model.nodes import NodeSpec
from cluster.web.serve import FrontFactory, start_site
from node.app import create_app as create_node_app
from node.config import NodeConfig
from router.app import ROUTER
from router.app import create_app as create_router_app
from router.config import RouterConfig
from router.front.server import front_for
from router.service import Router

ADMIN = "test-admin-token"
# Tests run on a pinned clock, 10 minutes into an hour, so that no test sees a
# fixed window or calendar period roll over just because of when it ran.
PINNED_MS = 1_803_895_200_000 + 10 * 60_000  # 2027-03-01T10:10:00Z
CLUSTER = "test-cluster-token"


@pytest.fixture(scope="session")
def redis_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RedisProcess]]:
    """Three Redis servers shared by the session; each test flushes them."""
    servers = []
    for i in range(3):
        server = RedisProcess(
            port=free_port(), data_dir=tmp_path_factory.mktemp(f"redis{i}"), aof=False
        )
        server.start()
        servers.append(server)
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture
def redis_servers(redis_pool: list[RedisProcess]) -> list[RedisProcess]:
    for server in redis_pool:
        if server.proc is None or server.proc.poll() is not None:
            server.start()
        client = redis.Redis(port=server.port)
        client.flushall()
        client.close()
    return redis_pool


async def _start(
    app: web.Application, front: FrontFactory | None = None
) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    port = free_port()
    await start_site(runner, "127.0.0.1", port, front=front)
    return runner, port


@dataclass
class Cluster:
    """A router and its nodes, all real HTTP servers in this process."""

    router_url: str
    router: Router
    http: aiohttp.ClientSession
    redis: list[RedisProcess]
    node_urls: dict[str, str]
    runners: list[web.AppRunner] = field(default_factory=list)
    rules_file: Path | None = None

    async def post(self, path: str, body: Any, token: str | None = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with self.http.post(self.router_url + path, json=body, headers=headers) as resp:
            return resp.status, await resp.json(content_type=None)

    async def check(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        status, data = await self.post("/v1/check", body)
        assert isinstance(data, dict)
        return status, data

    async def get(self, path: str, token: str | None = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with self.http.get(self.router_url + path, headers=headers) as resp:
            return resp.status, await resp.json(content_type=None)

    async def usage(self, key: str, rule: str) -> dict[str, Any]:
        async with self.http.get(
            self.router_url + "/v1/usage", params={"key": key, "rule": rule}
        ) as resp:
            assert resp.status == 200, await resp.text()
            data: dict[str, Any] = await resp.json()
            return data

    def owner_redis(self, key: str) -> RedisProcess:
        """The Redis of the node that owns `key` now."""
        owner = self.router.view.owner(key)
        return self.redis[sorted(self.node_urls).index(owner)]

    async def redis_now_ms(self) -> int:
        client = aioredis.Redis(port=self.redis[0].port)
        seconds, micros = await client.time()
        await client.aclose()
        return int(seconds * 1000 + micros // 1000)

    async def set_time(self, instant_ms: int, extra_nodes: tuple[str, ...] = ()) -> None:
        """Make every node's scripts see `instant_ms` now (test-mode clock offset)."""
        offset = instant_ms - await self.redis_now_ms()
        for url in (*self.node_urls.values(), *extra_nodes):
            async with self.http.post(
                url + "/node/v1/test/clock",
                json={"offset_ms": offset},
                headers={"Authorization": f"Bearer {CLUSTER}"},
            ) as resp:
                assert resp.status == 200, await resp.text()


async def node_batch(
    cluster: Cluster, node: str, ops: list[wire.Op], within_ms: int = 5000
) -> list[wire.Result]:
    """Speak the node protocol the way a router does (a deadline `within_ms` from now)."""
    return await batch_at(cluster, cluster.node_urls[node], ops, within_ms)


async def batch_at(
    cluster: Cluster, url: str, ops: list[wire.Op], within_ms: int = 5000
) -> list[wire.Result]:
    """node_batch() to a node endpoint by its URL (one that is not a member yet, say)."""
    batch = wire.Batch(int(time.time() * 1000) + within_ms, ops)
    async with cluster.http.post(
        url + wire.BATCH_PATH,
        data=wire.encode(batch),
        headers={"Authorization": f"Bearer {CLUSTER}", "Content-Type": wire.CONTENT_TYPE},
    ) as resp:
        assert resp.status == 200, await resp.text()
        return wire.decode_reply(await resp.read()).results


async def start_cluster(
    redis_servers: list[RedisProcess],
    tmp_path: Path,
    *,
    partitioner: str = "ring",
    node_deadline_ms: int = 2000,
    rules_yaml: str | None = None,
    nodes: int = 3,
) -> Cluster:
    runners: list[web.AppRunner] = []
    specs: list[NodeSpec] = []
    for i in range(nodes):
        app = create_node_app(
            NodeConfig(f"n{i + 1}", redis_servers[i].url, CLUSTER, test_mode=True)
        )
        runner, port = await _start(app)
        runners.append(runner)
        specs.append(NodeSpec(f"n{i + 1}", f"http://127.0.0.1:{port}"))
    tmp_path = tmp_path / partitioner
    tmp_path.mkdir(exist_ok=True)
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(rules_yaml or "rules: {}\n")
    config = RouterConfig(
        data_dir=tmp_path / "router",
        rules_file=rules_file,
        node_deadline_ms=node_deadline_ms,
        partitioner=partitioner,
        nodes=specs,
        rules_poll_ms=50,
    )
    router_app = create_router_app(config, ADMIN, CLUSTER)
    runner, port = await _start(router_app, front_for(router_app))
    runners.append(runner)
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    cluster = Cluster(
        router_url=f"http://127.0.0.1:{port}",
        router=router_app[ROUTER],
        http=http,
        redis=redis_servers,
        node_urls={s.id: s.url for s in specs},
        runners=runners,
        rules_file=rules_file,
    )
    await cluster.set_time(PINNED_MS)
    return cluster


async def stop_cluster(cluster: Cluster) -> None:
    await cluster.http.close()
    for runner in reversed(cluster.runners):
        await runner.cleanup()


RULES = """
rules:
  basic:
    limits:
      - {algorithm: fixed_window, limit: 5, window: 1h}
  pair:
    limits:
      - {algorithm: fixed_window, limit: 10, window: 1h}
      - {algorithm: fixed_window, limit: 3, window: 1m}
  payments:
    limits:
      - {algorithm: calendar, period: day, timezone: Europe/Paris, max_amount: "100.00"}
      - {algorithm: calendar, period: month, timezone: Europe/Paris, max_amount: "1000.00"}
  login:
    limits:
      - {algorithm: sliding_log, limit: 3, window: 1h}
  stock:
    limits:
      - {algorithm: quota, limit: 1000000, max_amount: "1000000.00"}
"""


def cluster_with_rules(rules_yaml: str) -> Any:
    """A `cluster` fixture serving `rules_yaml` (assign it to `cluster` in a test module)."""

    @pytest.fixture
    async def cluster(redis_servers: list[RedisProcess], tmp_path: Path) -> AsyncIterator[Cluster]:
        started = await start_cluster(redis_servers, tmp_path, rules_yaml=rules_yaml)
        try:
            yield started
        finally:
            await stop_cluster(started)

    return cluster


cluster = cluster_with_rules(RULES)


@pytest.fixture
def fourth_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    """The Redis of a node that joins during a test (`add_spare_node`)."""
    server = RedisProcess(port=free_port(), data_dir=tmp_path / "redis4", aof=False)
    server.start()
    yield server
    server.stop()


async def add_spare_node(cluster: Cluster, redis_server: RedisProcess, node_id: str = "n4") -> str:
    """Start a node on `redis_server`, running but not a member yet (for `node add`), on the
    cluster's clock; stopped with the cluster. Its URL."""
    runner, port = await _start(
        create_node_app(NodeConfig(node_id, redis_server.url, CLUSTER, test_mode=True))
    )
    cluster.runners.insert(len(cluster.runners) - 1, runner)  # the router stops first
    cluster.redis = [*cluster.redis, redis_server]
    url = f"http://127.0.0.1:{port}"
    await cluster.set_time(PINNED_MS, extra_nodes=(url,))
    return url


@pytest.fixture
async def slots_cluster(
    redis_servers: list[RedisProcess], tmp_path: Path
) -> AsyncIterator[Cluster]:
    started = await start_cluster(redis_servers, tmp_path, partitioner="slots", rules_yaml=RULES)
    try:
        yield started
    finally:
        await stop_cluster(started)


async def eventually(condition: Callable[[], Awaitable[bool]], within: float = 10.0) -> None:
    """Await a condition that has no event to wait on, up to `within` seconds."""

    async def poll() -> None:
        while not await condition():  # noqa: ASYNC110 - polling state owned by another process
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), within)


ROOMS = ("unit", "integration", "system")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test carries its room's marker (`pytest -m unit` runs the pure tests in seconds)."""
    for item in items:
        room = next((r for r in ROOMS if f"/tests/{r}/" in str(item.path)), None)
        if room is not None and not any(item.get_closest_marker(r) for r in ROOMS):
            item.add_marker(getattr(pytest.mark, room))


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test` runs two workers), each worker and the processes it
    starts pick free ports in a range of their own: two workers never race for one."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if worker.startswith("gw") and count > 0:
        first, last = 10_000, 32_000  # below the kernel's usual ephemeral ports
        span = (last - first) // count
        start = first + int(worker.removeprefix("gw")) * span
        os.environ[PORT_RANGE_ENV] = f"{start}-{start + span}"
