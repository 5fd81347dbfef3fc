"""A hung node (SIGSTOP, not a crash): its keys degrade within the timeout, then recover."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from cluster.local.redis_proc import RedisProcess, free_port
from cluster.model.nodes import NodeSpec
from node.app import create_app as create_node_app
from node.config import NodeConfig
from router.app import ROUTER
from router.app import create_app as create_router_app
from router.config import RouterConfig
from router.front.server import front_for
from tests.conftest import ADMIN, CLUSTER, _start, eventually

CALENDAR = {"algorithm": "calendar", "period": "day", "timezone": "UTC", "max_count": 100}


@pytest.mark.timeout(90)
async def test_sigstopped_node_degrades_fast_and_recovers(
    redis_servers: list[RedisProcess], tmp_path: Path
) -> None:
    runners = []
    specs = []
    for i in range(2):
        runner, port = await _start(
            create_node_app(NodeConfig(f"n{i + 1}", redis_servers[i].url, CLUSTER))
        )
        runners.append(runner)
        specs.append(NodeSpec(f"n{i + 1}", f"http://127.0.0.1:{port}"))
    port = free_port()
    env = dict(os.environ, SHARDLIMIT_CLUSTER_TOKEN=CLUSTER)
    hung = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "cluster.cli",
        "serve",
        "node",
        "--id",
        "n3",
        "--port",
        str(port),
        "--redis",
        redis_servers[2].url,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    specs.append(NodeSpec("n3", f"http://127.0.0.1:{port}"))
    try:
        async with aiohttp.ClientSession() as http:

            async def n3_up() -> bool:
                try:
                    async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                        return resp.status == 200
                except aiohttp.ClientError:
                    return False

            await eventually(n3_up, within=20)
        config = RouterConfig(data_dir=tmp_path / "router", nodes=specs)
        app = create_router_app(config, ADMIN, CLUSTER)
        router_runner, router_port = await _start(app, front_for(app))
        runners.append(router_runner)
        router = app[ROUTER]
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{router_port}/v1/check"

            async def check(key: str) -> tuple[float, dict[str, object]]:
                started = time.perf_counter()
                async with http.post(url, json={"key": key, "limits": [CALENDAR]}) as resp:
                    body = await resp.json()
                return time.perf_counter() - started, body

            keys = [f"k{i}" for i in range(400)]
            n3_keys = [k for k in keys if router.view.owner(k) == "n3"][:60]
            other = [k for k in keys if router.view.owner(k) != "n3"][:60]
            for key in n3_keys[:3]:
                _, body = await check(key)
                assert body["degraded"] is False
            hung.send_signal(signal.SIGSTOP)
            timings = []
            for key in n3_keys:
                elapsed, body = await check(key)
                timings.append(elapsed)
                assert body["degraded"] is True and body["allowed"] is False  # calendar: deny
            for key in other:
                _, body = await check(key)
                assert body["degraded"] is False and body["allowed"] is True
            assert router.view.clients["n3"].state == "down"
            timings.sort()
            p99 = timings[int(len(timings) * 0.99) - 1]
            print(f"hung node: p99 {p99 * 1000:.1f} ms, max {timings[-1] * 1000:.1f} ms")
            hung.send_signal(signal.SIGCONT)

            async def recovered() -> bool:
                _, body = await check(n3_keys[0])
                return body["degraded"] is False

            await eventually(recovered, within=10)
    finally:
        hung.send_signal(signal.SIGCONT)
        hung.terminate()
        await hung.wait()
        for runner in reversed(runners):
            await runner.cleanup()
