"""A quick closed-loop throughput probe against a running router.

Not the benchmark suite (see the README's Performance section): it reports
single-check and batch decisions/s plus client-side latency percentiles, as JSON.

    python -m bench.quick --router http://127.0.0.1:8080 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from typing import Any

import aiohttp

LIMIT = [{"algorithm": "fixed_window", "limit": 1_000_000, "window": "1h"}]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def single(router: str, seconds: float, concurrency: int, keys: int) -> dict[str, Any]:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    rng = random.Random(1)

    async def worker(http: aiohttp.ClientSession) -> None:
        while time.perf_counter() < deadline:
            body = {"key": f"user:{rng.randrange(keys)}", "limits": LIMIT}
            start = time.perf_counter()
            async with http.post(router + "/v1/check", json=body) as resp:
                await resp.read()
                assert resp.status in (200, 429), resp.status
            latencies.append(time.perf_counter() - start)

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as http:
        started = time.perf_counter()
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {
        "checks_per_s": round(len(latencies) / elapsed),
        "p50_ms": round(percentile(latencies, 0.5) * 1000, 2),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 2),
        "concurrency": concurrency,
    }


async def batched(router: str, seconds: float, concurrency: int, keys: int) -> dict[str, Any]:
    decisions = 0
    deadline = time.perf_counter() + seconds
    rng = random.Random(2)

    async def worker(http: aiohttp.ClientSession) -> None:
        nonlocal decisions
        while time.perf_counter() < deadline:
            checks = [{"key": f"user:{rng.randrange(keys)}", "limits": LIMIT} for _ in range(100)]
            async with http.post(router + "/v1/check/batch", json={"checks": checks}) as resp:
                await resp.read()
                assert resp.status == 200
            decisions += 100

    async with aiohttp.ClientSession() as http:
        started = time.perf_counter()
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {"decisions_per_s": round(decisions / elapsed), "batch": 100, "concurrency": concurrency}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "single": await single(args.router, args.seconds, args.concurrency, args.keys),
        "batch": await batched(args.router, args.seconds, args.batch_concurrency, args.keys),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--router", default="http://127.0.0.1:8080")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--batch-concurrency", type=int, default=4)
    print(json.dumps(asyncio.run(main_async(parser.parse_args())), indent=2))


if __name__ == "__main__":
    main()
