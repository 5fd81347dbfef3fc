"""One script call through either sender (node/store/redispy_pipe.py `run_script`), against
a real redis-server: loaded again once the Redis lost its scripts, error replies raised."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from cluster.local.redis_proc import RedisProcess
from node.store.redispy_pipe import RedisPyPipe, Sender, own_sender, run_script
from node.store.resp import RespPipe

pytestmark = pytest.mark.timeout(60)

INCR = "return redis.call('INCRBY', KEYS[1], ARGV[1])"


@pytest.fixture(params=[True, False], ids=["lean pipe", "redis-py"])
async def client_and_sender(
    redis_servers: list[RedisProcess], request: pytest.FixtureRequest
) -> AsyncIterator[tuple[aioredis.Redis, Sender]]:
    client = aioredis.Redis(port=redis_servers[0].port)
    sender = own_sender(client, lean=request.param)
    assert isinstance(sender, RespPipe if request.param else RedisPyPipe)
    yield client, sender
    await sender.close()
    await client.aclose()


def _incr(client: aioredis.Redis) -> AsyncScript:
    return client.register_script(INCR)


async def test_a_script_the_redis_lost_is_loaded_and_runs_once(
    client_and_sender: tuple[aioredis.Redis, Sender],
) -> None:
    client, sender = client_and_sender
    script = _incr(client)
    await client.delete("n")
    await client.script_flush()
    assert await run_script(sender, script, ["n"], [5]) == 5
    assert await client.script_exists(script.sha) == [True]
    assert await run_script(sender, script, ["n"], [2]) == 7
    await client.script_flush()
    assert await run_script(sender, script, ["n"], [1]) == 8
    assert await client.get("n") == b"8"  # each call applied exactly once


async def test_an_error_reply_is_raised_and_the_sender_goes_on(
    client_and_sender: tuple[aioredis.Redis, Sender],
) -> None:
    client, sender = client_and_sender
    script = _incr(client)
    await client.set("text", "not a number")
    with pytest.raises(ResponseError, match="not an integer"):
        await run_script(sender, script, ["text"], [1])
    await client.delete("m")
    assert await run_script(sender, script, ["m"], [3]) == 3
