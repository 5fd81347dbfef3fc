"""The router's liveness probe of one node (router/channel/liveness.py) over real sockets."""

from __future__ import annotations

import asyncio

import pytest

from cluster.local.redis_proc import free_port
from router.channel.control_client import HttpPool
from router.channel.liveness import LivenessProbe

pytestmark = pytest.mark.timeout(30)


async def test_probes_at_once_of_a_node_gone_both_answer_down() -> None:
    """Every reset connection of a node that died starts a probe: those running at once
    all find its liveness port refused, and each says the node is down (none raises)."""
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: refused
    probe = LivenessProbe(url, HttpPool(url, {}), None)
    probe.learn_port(free_port())
    assert probe.live_pool is not None
    try:
        answers = await asyncio.gather(probe.probe(), probe.probe(), probe.probe())
        assert list(answers) == [False, False, False]
        assert probe.live_pool is None and probe.live_port is None
    finally:
        probe.close()
        probe.pool.close()
