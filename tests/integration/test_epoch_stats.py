"""The brief stats a router's epoch poll reads (wire.EPOCH_STATS_PATH): the fields the
poll follows, the same as in the whole stats, and nothing read from Redis' INFO."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from cluster import wire
from cluster.local.redis_proc import RedisProcess, free_port
from node.app import create_app
from node.config import NodeConfig
from tests.conftest import CLUSTER

pytestmark = pytest.mark.timeout(60)

HEADERS = {"Authorization": f"Bearer {CLUSTER}"}
POLLED = {"node", "epoch", "live", "cluster_id", "partitioner", "rules_version"}


@pytest.fixture
async def node_url(redis_servers: list[RedisProcess]) -> AsyncIterator[str]:
    runner = web.AppRunner(create_app(NodeConfig("n1", redis_servers[0].url, CLUSTER)))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def _get(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url, headers=HEADERS) as resp:
        assert resp.status == 200, await resp.text()
        body: dict[str, Any] = await resp.json()
        return body


async def test_brief_stats_hold_what_the_poll_follows_and_no_info(node_url: str) -> None:
    async with aiohttp.ClientSession() as http:
        brief = await _get(http, node_url + wire.EPOCH_STATS_PATH)
        assert set(brief) == POLLED
        assert brief["node"] == "n1"
        assert brief["rules_version"] == 0
        assert isinstance(brief["live"], int)

        document = {"version": 3, "rules": {"api": {"limits": [{"count": 5, "window": "1m"}]}}}
        async with http.put(node_url + wire.RULES_PATH, json=document, headers=HEADERS) as resp:
            assert resp.status == 200, await resp.text()
        brief = await _get(http, node_url + wire.EPOCH_STATS_PATH)
        assert brief["rules_version"] == 3

        whole = await _get(http, node_url + wire.STATS_PATH)
        assert {name: whole[name] for name in POLLED} == brief
        assert {"memory", "keys", "replication", "redis_version"} <= set(whole)


async def test_brief_stats_need_the_cluster_token(node_url: str) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.get(node_url + wire.EPOCH_STATS_PATH) as resp,
    ):
        assert resp.status == 401
