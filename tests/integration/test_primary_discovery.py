"""Which server a node writes to under Sentinel: the primary named at the highest config
epoch by any Sentinel, whatever the order of the Sentinels in its URL, and never, right
after a +switch-master, a server named at no higher an epoch than before.

Two real Sentinels disagree here on purpose: each watches the shard's name on a redis-server
of its own, at a config epoch of its own (as a Sentinel that has not heard of the last
promotion yet names the old primary, at the old epoch). The old one believes it is a
primary, so its ROLE check alone would pass."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from redis.exceptions import ConnectionError

from cluster.local.ports import free_port
from cluster.local.redis_proc import RedisProcess
from cluster.local.sentinel_proc import SentinelProcess
from node.store.connect import redis_client, sentinel_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
NAME = "n1"


@dataclass
class Disagreeing:
    old: RedisProcess  # named by `stale` at epoch 3
    new: RedisProcess  # named by `fresh` at epoch 7
    stale: SentinelProcess
    fresh: SentinelProcess

    def url(self, *sentinels: SentinelProcess) -> str:
        hosts = ",".join(f"{s.host}:{s.port}" for s in sentinels)
        return f"redis+sentinel://{hosts}/{NAME}"


def _sentinel(
    tmp_path: Path, name: str, primary: RedisProcess, epoch: int, taken: set[int]
) -> SentinelProcess:
    port = free_port(avoid=taken)
    taken.add(port)
    sentinel = SentinelProcess(
        port, tmp_path / name, {NAME: (primary.host, primary.port)}, quorum=1
    )
    sentinel.data_dir.mkdir(parents=True)
    sentinel.config_file.write_text(sentinel.config() + f"sentinel config-epoch {NAME} {epoch}\n")
    return sentinel


@pytest.fixture
def disagreeing(tmp_path: Path) -> Iterator[Disagreeing]:
    taken: set[int] = set()
    servers = []
    for name in ("old", "new"):
        port = free_port(avoid=taken)
        taken.add(port)
        servers.append(RedisProcess(port, tmp_path / name))
    old, new = servers
    stale = _sentinel(tmp_path, "stale", old, 3, taken)
    fresh = _sentinel(tmp_path, "fresh", new, 7, taken)
    started: list[RedisProcess | SentinelProcess] = []
    try:
        for process in (old, new, stale, fresh):
            process.start()
            started.append(process)
        yield Disagreeing(old, new, stale, fresh)
    finally:
        for process in reversed(started):
            process.stop()


def _holds(server: RedisProcess, key: str) -> bool:
    client = redis.Redis(host=server.host, port=server.port)
    try:
        return bool(client.exists(key))
    finally:
        client.close()


@pytest.mark.parametrize("stale_first", [True, False], ids=["stale-sentinel-first", "fresh-first"])
async def test_the_primary_named_at_the_highest_epoch_is_written_to(
    disagreeing: Disagreeing, stale_first: bool
) -> None:
    d = disagreeing
    order = (d.stale, d.fresh) if stale_first else (d.fresh, d.stale)
    client = redis_client(d.url(*order), socket_connect_timeout=1.0, socket_timeout=1.0)
    try:
        await client.set("written", 1)
    finally:
        await client.aclose()
    assert _holds(d.new, "written")
    assert not _holds(d.old, "written")


async def test_after_a_switch_an_answer_no_newer_than_before_is_refused(
    disagreeing: Disagreeing,
) -> None:
    d = disagreeing
    client = redis_client(d.url(d.fresh), socket_connect_timeout=1.0, socket_timeout=1.0)
    pool = sentinel_pool(client)
    assert pool is not None
    try:
        await client.set("before", 1)
        assert pool.newest == (7, (d.new.host, d.new.port))
        # Sentinel announces a promotion of `old` that the Sentinel asked has not heard of:
        # its answer (`new`, at the epoch the node already knew) is stale.
        pool.switched((d.old.host, d.old.port))
        await pool.disconnect()
        with pytest.raises(ConnectionError, match="not heard of the promotion"):
            await client.set("meanwhile", 1)
        assert not _holds(d.new, "meanwhile")
        # A Sentinel that names the announced primary is believed.
        await client.aclose()
        client = redis_client(d.url(d.stale), socket_connect_timeout=1.0, socket_timeout=1.0)
        pool = sentinel_pool(client)
        assert pool is not None
        pool.switched((d.old.host, d.old.port))
        await client.set("after", 1)
        assert _holds(d.old, "after")
    finally:
        await client.aclose()
