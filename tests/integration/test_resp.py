"""The node's pipelined script connection (node/store/resp.py) against a real redis-server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, NoScriptError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from cluster.local.redis_proc import RedisProcess, free_port
from cluster.wire import Op as WireOp
from node.batch.ops import parse_op
from node.store.counter_store import CounterStore
from node.store.redispy_pipe import own_sender
from node.store.resp import EachKey, RespPipe

pytestmark = pytest.mark.timeout(60)

INCR = "return redis.call('INCRBY', KEYS[1], ARGV[1])"


async def test_replies_come_back_in_order_to_concurrent_callers(
    redis_servers: list[RedisProcess],
) -> None:
    client = aioredis.Redis(port=redis_servers[0].port)
    sha = await client.script_load(INCR)
    pipe = RespPipe.for_client(client)
    assert pipe is not None
    try:

        async def caller(i: int) -> list[object]:
            return await pipe.execute([("EVALSHA", sha, 1, f"k{i}", i), ("GET", f"k{i}")])

        replies = await asyncio.gather(*(caller(i) for i in range(200)))
        assert replies == [[i, str(i).encode()] for i in range(200)]
    finally:
        await pipe.close()
        await client.aclose()


@pytest.mark.parametrize("lean", [True, False], ids=["lean pipe", "redis-py"])
async def test_the_same_commands_for_each_key_answer_as_written_out(
    redis_servers: list[RedisProcess], lean: bool
) -> None:
    client = aioredis.Redis(port=redis_servers[0].port)
    sender = own_sender(client, lean=lean)
    keys = [f"c12345678|user:{i}" for i in range(50)] + ["c12345678|ünïcode", "c12345678|gone"]
    for i, key in enumerate(keys[:-1]):
        await client.set(key, i, px=3_600_000 if i % 2 else None)
    try:
        each = EachKey(("DUMP", "GET"), keys)
        assert len(each) == 2 * len(keys) and each[-1] == ("GET", "c12345678|gone")
        written_out = [(verb, key) for key in keys for verb in ("DUMP", "GET")]
        assert list(each) == written_out
        replies = await sender.execute(each)
        assert replies == await sender.execute(written_out)
        assert replies[1::2] == [str(i).encode() for i in range(51)] + [None]
        assert all(isinstance(dump, bytes) for dump in replies[0:102:2]) and replies[-2] is None
        ttls = await sender.execute(EachKey(("PTTL",), keys))
        assert [ttl > 0 for ttl in ttls[:50]] == [bool(i % 2) for i in range(50)]
        assert ttls[50:] == [-1, -2]  # no expiry; no such key
        assert await sender.execute(EachKey(("PTTL",), [])) == []
    finally:
        await sender.close()
        await client.aclose()


async def test_an_error_reply_is_redis_py_s_exception_in_its_slot(
    redis_servers: list[RedisProcess],
) -> None:
    pipe = RespPipe(port=redis_servers[0].port)
    try:
        replies = await pipe.execute(
            [("SET", "a", "1"), ("EVALSHA", "0" * 40, 0), ("INCR", "a"), ("LPUSH", "a", "x")]
        )
        assert replies[0] == b"OK"
        assert isinstance(replies[1], NoScriptError)
        assert replies[2] == 2
        assert isinstance(replies[3], ResponseError)
        assert "WRONGTYPE" in str(replies[3])
    finally:
        await pipe.close()


async def test_a_lost_connection_fails_its_callers_and_the_next_call_reconnects(
    tmp_path: Path,
) -> None:
    server = RedisProcess(port=free_port(), data_dir=tmp_path, aof=False)
    server.start()
    pipe = RespPipe(port=server.port)
    try:
        assert await pipe.execute([("PING",)]) == [b"PONG"]
        # BLPOP holds the reply back until the server goes away under it.
        waiting = asyncio.ensure_future(pipe.execute([("BLPOP", "nothing", 0)]))
        await asyncio.sleep(0)  # let it be written before the kill, not a wait for a state
        server.kill()
        with pytest.raises(RedisConnectionError):
            await waiting
        with pytest.raises(RedisConnectionError):
            await pipe.execute([("PING",)])  # refused: nobody listens
        server.start()
        assert await pipe.execute([("PING",)]) == [b"PONG"]
    finally:
        await pipe.close()
        server.stop()


async def test_auth_and_database_come_from_the_client_url(
    redis_servers: list[RedisProcess],
) -> None:
    port = redis_servers[1].port
    admin = aioredis.Redis(port=port)
    await admin.acl_setuser(
        "limiter", enabled=True, passwords=["+s3cret"], keys=["*"], commands=["+@all"]
    )
    try:
        client = aioredis.from_url(f"redis://limiter:s3cret@127.0.0.1:{port}/3")
        pipe = RespPipe.for_client(client)
        assert pipe is not None
        try:
            assert await pipe.execute([("SET", "in-db-3", "yes")]) == [b"OK"]
        finally:
            await pipe.close()
            await client.aclose()
        assert await admin.get("in-db-3") is None
        assert await aioredis.Redis(port=port, db=3).get("in-db-3") == b"yes"
        wrong = RespPipe(port=port, username="limiter", password="wrong")
        with pytest.raises(AuthenticationError):
            await wrong.execute([("PING",)])
        await wrong.close()
    finally:
        await admin.acl_deluser("limiter")
        await admin.aclose()


def test_tls_clients_keep_redis_py_s_pipeline() -> None:
    client = aioredis.from_url("rediss://127.0.0.1:6380/0")
    assert RespPipe.for_client(client) is None
    assert CounterStore(client).lean_pipe is None


async def test_both_script_paths_decide_alike(redis_servers: list[RedisProcess]) -> None:
    """The raw pipe and redis-py's pipeline (kept for TLS) give the same raw results."""
    spec = ["fixed_window", 3, 60_000, None, None, None, None, None]
    outcomes = []
    for raw_pipe, scope in ((True, "raw"), (False, "redispy")):
        client = aioredis.Redis(port=redis_servers[2].port)
        store = CounterStore(client, raw_pipe=raw_pipe)
        assert (store.lean_pipe is not None) is raw_pipe
        ops = [parse_op(WireOp("check", "u", scope, [spec], [0], cost=1)) for _ in range(4)]
        refund = parse_op(WireOp("refund", "u", scope, [spec], [0], cost=1, request_id="r1"))
        results = [(await store.run([op]))[0] for op in ops] + await store.run([refund])
        outcomes.append([r[:3] if isinstance(r, list) else r for r in results])
        await store.close()
        await client.aclose()
    assert outcomes[0] == outcomes[1]
    assert [row[0] for row in outcomes[0][:4]] == [1, 1, 1, 0]
