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

from cluster.limits import LimitSpec
from cluster.redis_proc import RedisProcess, free_port
from node.ops import parse_op
from node.store import CounterStore

SPECS = {
    "fixed_window": LimitSpec("fixed_window", limit=100, window_ms=60_000),
    "sliding_window": LimitSpec("sliding_window", limit=100, window_ms=60_000),
    "token_bucket": LimitSpec("token_bucket", limit=20, window_ms=3_600_000, rate=10),
    "calendar": LimitSpec("calendar", limit=100, period="day", timezone="Europe/Paris"),
    "sliding_log (1 hit)": LimitSpec("sliding_log", limit=100, window_ms=60_000),
}


async def measure(keys: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sl-bench-memory-") as tmp:
        return await _measure(keys, Path(tmp))


async def _measure(keys: int, tmp: Path) -> dict[str, Any]:
    server = RedisProcess(port=free_port(), data_dir=tmp, aof=False)
    client = aioredis.Redis(port=server.port)
    store = CounterStore(client)
    out: dict[str, Any] = {}
    try:
        server.start()
        for name, spec in SPECS.items():
            await client.flushall()
            before = (await client.info("memory"))["used_memory"]
            for start in range(0, keys, 2000):
                ops = [
                    parse_op({"op": "check", "key": f"user:{i}", "scope": "api",
                              "limits": [spec.to_wire()], "amounts": [0], "cost": 1})
                    for i in range(start, min(keys, start + 2000))
                ]  # fmt: skip
                results = await store.run(ops)
                failed = [r for r in results if isinstance(r, Exception)]
                assert not failed, failed[:1]
            after = (await client.info("memory"))["used_memory"]
            assert await client.dbsize() == keys, (name, await client.dbsize())
            out[name] = round((after - before) / keys, 1)
    finally:
        await client.aclose()
        server.stop()
    return {"keys": keys, "bytes_per_key": out, "example_key": "sl|c|api|fw:60000|user:12345"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=100_000)
    print(json.dumps(asyncio.run(measure(parser.parse_args().keys)), indent=2))


if __name__ == "__main__":
    main()
