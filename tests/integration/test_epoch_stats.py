"""The brief stats a router's epoch poll reads (wire.EPOCH_STATS_PATH): the fields the
poll follows, the same as in the whole stats, and nothing read from Redis' INFO."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from cluster import wire
from cluster.local.redis_proc import RedisProcess
from tests.conftest import CLUSTER
from tests.support.node_app import node_on_port

pytestmark = pytest.mark.timeout(60)

HEADERS = {"Authorization": f"Bearer {CLUSTER}"}
POLLED = {"node", "epoch", "live", "cluster_id", "partitioner", "rules_version"}


@pytest.fixture
async def node_url(redis_servers: list[RedisProcess]) -> AsyncIterator[str]:
    async with node_on_port(redis_servers[0].url) as url:
        yield url


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
