"""The copy's budget reads its commands' time from the source Redis itself (INFO
commandstats: SCAN, DUMP, UNLINK), through redis-py's client or the copy's lean pipe, and
times its calls itself where Redis refuses INFO."""

from __future__ import annotations

import pytest
import redis as sync_redis
import redis.asyncio as aioredis

from cluster.local.redis_proc import RedisProcess
from node.migration.copy_step import Budget
from node.migration.redis_time import COPY_COMMANDS, READ_EVERY_S, RedisTime
from node.store.redispy_pipe import own_sender


def copy_usec(client: sync_redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("usec", 0)) for name in COPY_COMMANDS)


@pytest.mark.parametrize("piped", [False, True], ids=["redis-py", "lean pipe"])
async def test_a_reading_is_the_time_redis_counted_for_the_copys_commands(
    redis_servers: list[RedisProcess], piped: bool
) -> None:
    source = redis_servers[0]
    admin = sync_redis.Redis(port=source.port)
    now = [100.0]
    client = aioredis.Redis(port=source.port)
    sender = own_sender(client, lean=piped)
    redis_time = RedisTime(sender, clock=lambda: now[0])
    try:
        before = copy_usec(admin)
        assert await redis_time.used() is None  # the first reading: where counts begin
        names = [f"k{i}" for i in range(3000)]
        admin.mset({name: "1" for name in names})
        admin.incr("live")  # a live command: not the copy's
        cursor, found = 0, 0
        while True:
            cursor, keys = admin.scan(cursor, count=500)
            found += len(keys)
            if cursor == 0:
                break
        admin.unlink(*names[:1000])
        admin.dump(names[-1])
        assert await redis_time.used() is None  # not due: no INFO sent
        now[0] += 2 * READ_EVERY_S
        reading = await redis_time.used()
        spent = copy_usec(admin) - before
        assert reading is not None and found == 3001
        used, since = reading
        assert since == 100.0 and spent > 0
        assert round(used * 1e6) == spent
        assert admin.dbsize() == 2001
    finally:
        await sender.close()
        await client.aclose()
        admin.close()


@pytest.mark.parametrize("piped", [False, True], ids=["redis-py", "lean pipe"])
async def test_where_redis_refuses_info_the_budget_times_the_calls(
    redis_servers: list[RedisProcess], piped: bool
) -> None:
    admin = sync_redis.Redis(port=redis_servers[0].port)
    admin.acl_setuser(
        "copier", enabled=True, passwords=["+secret"], keys=["*"], commands=["+@all", "-info"]
    )
    client = aioredis.Redis(port=redis_servers[0].port, username="copier", password="secret")
    sender = own_sender(client, lean=piped)
    try:
        redis_time = RedisTime(sender)
        budget = Budget(busy_pct=50, redis_time=redis_time)
        assert budget.counted_by_redis
        await budget.after(0.0)
        assert not redis_time.usable and not budget.counted_by_redis
        # Timed here: a call of 4 ms at 50 % leaves Redis to live traffic for 4 ms more,
        # less the millisecond credited to a first call.
        await budget.after(0.004)
        assert budget.paused_s > 0
    finally:
        await sender.close()
        await client.aclose()
        admin.acl_deluser("copier")
        admin.close()
