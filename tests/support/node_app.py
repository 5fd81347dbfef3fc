"""A node's app answering on a real port, in the test's own process."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from cluster.local.redis_proc import free_port
from node.app import create_app
from node.config import NodeConfig
from tests.conftest import CLUSTER


@contextlib.asynccontextmanager
async def node_on_port(redis_url: str, node_id: str = "n1") -> AsyncIterator[str]:
    """The node's base URL while it serves (with the suite's cluster token)."""
    runner = web.AppRunner(create_app(NodeConfig(node_id, redis_url, CLUSTER)))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
