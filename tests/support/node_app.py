"""A node's app answering on a real port, in the test's own process."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from node.app import create_app
from node.config import NodeConfig
from tests.conftest import CLUSTER, _start


@contextlib.asynccontextmanager
async def node_on_port(redis_url: str, node_id: str = "n1") -> AsyncIterator[str]:
    """The node's base URL while it serves (with the suite's cluster token)."""
    runner, port = await _start(create_app(NodeConfig(node_id, redis_url, CLUSTER)))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
