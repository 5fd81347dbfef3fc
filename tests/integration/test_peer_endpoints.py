"""A node's call to a peer shard tries the shard's endpoints in order, moves on past one
it cannot reach (refused, or no answer in time), sticks to the one that answered, and
takes an endpoint's error answer as the shard's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from cluster import wire
from cluster.local.redis_proc import RedisProcess, free_port
from node.errors import PeerError
from node.migration.peer_client import PeerClient
from tests.conftest import CLUSTER
from tests.support.node_app import node_on_port

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def live(redis_servers: list[RedisProcess]) -> AsyncIterator[str]:
    """A node endpoint answering on a real port."""
    async with node_on_port(redis_servers[0].url) as url:
        yield url


@pytest.fixture
async def hung() -> AsyncIterator[str]:
    """An endpoint that takes connections and never answers (a hung host)."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    for writer in held:
        writer.close()
    server.close()
    await server.wait_closed()


@pytest.fixture
async def peers() -> AsyncIterator[PeerClient]:
    session = aiohttp.ClientSession()
    yield PeerClient(lambda: session, CLUSTER)
    await session.close()


def refused() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


ABORT = {"batch": "b1", "decision": "abort"}


async def test_a_call_moves_past_unreachable_endpoints_and_sticks_to_the_one_that_answered(
    peers: PeerClient, live: str, hung: str
) -> None:
    endpoints = (refused(), hung, live)
    answer = await peers.post(endpoints, wire.DECISION_PATH, ABORT, timeout_s=0.5)
    assert answer == {"batch": "b1", "decision": "abort"}
    assert peers.order(endpoints) == (live, endpoints[0], hung)
    # The next call goes to the endpoint that answered first: no wait on the hung one.
    again = await peers.post(endpoints, wire.DECISION_PATH, ABORT, timeout_s=30.0)
    assert again == {"batch": "b1", "decision": "abort"}
    assert await peers.redis_identity(endpoints) is not None


async def test_an_endpoints_error_answer_is_the_shards(
    peers: PeerClient, live: str, hung: str
) -> None:
    with pytest.raises(PeerError) as raised:
        await peers.post((live, hung), wire.DECISION_PATH, {"batch": "b1"}, timeout_s=30.0)
    assert raised.value.status == 400
    assert peers.order((live, hung)) == (live, hung)


async def test_a_shard_with_no_endpoint_reachable_fails_naming_each(
    peers: PeerClient, hung: str
) -> None:
    gone = refused()
    with pytest.raises(PeerError) as raised:
        await peers.post((gone, hung), wire.DECISION_PATH, ABORT, timeout_s=0.3)
    assert raised.value.status is None
    assert gone in str(raised.value) and hung in str(raised.value)
    assert peers.order((gone, hung)) == (gone, hung)
