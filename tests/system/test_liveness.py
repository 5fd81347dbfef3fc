"""A node's liveness answer comes from a thread of its own (node/health/liveness.py): it
answers while the node's event loop is busy, and not at all while the process is
stopped. That is what lets a router tell a hung node from a busy one."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from cluster.local.procs import proc_state, until
from cluster.local.redis_proc import RedisProcess, free_port
from node.app import create_app
from node.config import NodeConfig
from tests.conftest import CLUSTER, _start, eventually

PROBE = """
import socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10) as s:
    s.sendall(b"GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
    print(s.recv(100).split(b"\\r\\n")[0].decode())
"""


def probe(port: int, timeout: float) -> bytes:
    """One liveness request from this thread; the status line (b"" if none came)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            return conn.recv(100).split(b"\r\n")[0]
        except TimeoutError:
            return b""


async def live_port(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(url + "/healthz") as resp:
        port: int = (await resp.json())["live"]
        return port


@pytest.mark.timeout(60)
async def test_liveness_is_answered_while_the_event_loop_is_busy(
    redis_servers: list[RedisProcess],
) -> None:
    runner, port = await _start(create_app(NodeConfig("n1", redis_servers[0].url, CLUSTER)))
    try:
        async with aiohttp.ClientSession() as http:
            live = await live_port(http, f"http://127.0.0.1:{port}")
        prober = subprocess.Popen(  # noqa: ASYNC220 - blocking this loop is the point
            [sys.executable, "-c", PROBE, str(live)], stdout=subprocess.PIPE, text=True
        )
        # Keep the event loop busy, never yielding, until the prober has its answer:
        # only a thread of its own can have answered it.
        for _ in range(20_000_000):
            if prober.poll() is not None:
                break
        else:
            prober.kill()
        out, _ = prober.communicate(timeout=10)
        assert out.strip() == "HTTP/1.1 200 OK"
    finally:
        await runner.cleanup()


@pytest.mark.timeout(60)
async def test_a_stopped_node_answers_no_liveness_probe(
    redis_servers: list[RedisProcess], tmp_path: Path
) -> None:
    port = free_port()
    env = dict(os.environ, SHARDLIMIT_CLUSTER_TOKEN=CLUSTER)
    node = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "cluster.cli",
        "serve",
        "node",
        "--id",
        "n9",
        "--port",
        str(port),
        "--redis",
        redis_servers[0].url,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        async with aiohttp.ClientSession() as http:

            async def up() -> bool:
                try:
                    await live_port(http, f"http://127.0.0.1:{port}")
                except aiohttp.ClientError:
                    return False
                return True

            await eventually(up, within=30)
            live = await live_port(http, f"http://127.0.0.1:{port}")
        assert await asyncio.to_thread(probe, live, 5.0) == b"HTTP/1.1 200 OK"
        node.send_signal(signal.SIGSTOP)
        await until(lambda: proc_state(node.pid) == "T", 10, "node stopped")
        # The kernel still accepts the connection; nobody answers it.
        assert await asyncio.to_thread(probe, live, 1.0) == b""
        node.send_signal(signal.SIGCONT)
        assert await asyncio.to_thread(probe, live, 5.0) == b"HTTP/1.1 200 OK"
    finally:
        node.send_signal(signal.SIGCONT)
        node.terminate()
        await node.wait()
