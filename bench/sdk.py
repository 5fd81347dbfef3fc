"""Decisions/s of the async SDK through the router, and of the `limits` library on one Redis.

Each side runs in its own process (uvloop) with `callers` coroutines that check random
keys among `keys` in a loop against a fixed window of 100 per minute, for `warmup` +
`seconds`; only what finishes after the warm-up counts.

    python -m bench.sdk shardlimit --router http://127.0.0.1:8080
    python -m bench.sdk limits --redis redis://127.0.0.1:6379/0 [--implementation redispy]

`shardlimit`: `cluster.sdk.client.AsyncClient.check(...)` (concurrent calls of one loop tick
are coalesced into one /v1/check/batch). `limits`: `limits.aio` with
`storage_from_string("async+redis://...")` and `FixedWindowRateLimiter.hit`, item
"100/minute"; its default async Redis client is coredis (the `async-redis` extra),
`--implementation redispy` uses redis-py's asyncio client instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from bench.openloop import percentile_ms

LIMIT = [{"algorithm": "fixed_window", "limit": 100, "window": "1m"}]

# One check of `key`: (allowed, degraded).
CheckFn = Callable[[str], Awaitable[tuple[bool, bool]]]


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


async def drive(
    check: CheckFn, callers: int, seconds: float, warmup: float, keys: int
) -> dict[str, Any]:
    """`callers` concurrent loops of `check` on random keys; counts after the warm-up."""
    latencies: list[float] = []
    counts = {"allowed": 0, "denied": 0, "degraded": 0, "errors": 0}
    errors: dict[str, int] = {}
    start = time.monotonic()
    counting = start + warmup
    deadline = counting + seconds

    async def caller(seed: int) -> None:
        rng = random.Random(seed)
        while (began := time.monotonic()) < deadline:
            try:
                allowed, degraded = await check(f"user:{rng.randrange(keys)}")
            except Exception as exc:  # counted, reported, and the caller goes on
                if began >= counting:
                    counts["errors"] += 1
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                continue
            if began >= counting:
                latencies.append(time.monotonic() - began)
                counts["allowed" if allowed else "denied"] += 1
                counts["degraded"] += degraded

    await asyncio.gather(*(caller(seed) for seed in range(callers)))
    elapsed = time.monotonic() - counting
    latencies.sort()
    decisions = len(latencies)
    return {
        "callers": callers,
        "seconds": round(elapsed, 2),
        "decisions": decisions,
        "decisions_per_s": round(decisions / elapsed, 1),
        # A degraded decision was taken without the node (on_failure): not a served one.
        "served_decisions_per_s": round((decisions - counts["degraded"]) / elapsed, 1),
        **counts,
        "error_types": errors,
        "p50_ms": percentile_ms(latencies, 0.5),
        "p99_ms": percentile_ms(latencies, 0.99),
    }


async def run_shardlimit(args: argparse.Namespace) -> dict[str, Any]:
    from cluster.sdk.client import AsyncClient

    async with AsyncClient(args.router, timeout=5.0) as client:

        async def check(key: str) -> tuple[bool, bool]:
            decision = await client.check(key, limits=LIMIT)
            return decision.allowed, decision.degraded

        result = await drive(check, args.callers, args.seconds, args.warmup, args.keys)
    return {"client": "cluster.sdk.client.AsyncClient (coalescing)", **result}


async def run_limits(args: argparse.Namespace) -> dict[str, Any]:
    from limits import parse
    from limits.aio.strategies import FixedWindowRateLimiter
    from limits.storage import storage_from_string

    uri = "async+" + args.redis
    storage = storage_from_string(uri, implementation=args.implementation)
    limiter = FixedWindowRateLimiter(storage)
    item = parse("100/minute")

    async def check(key: str) -> tuple[bool, bool]:
        return await limiter.hit(item, key), False

    result = await drive(check, args.callers, args.seconds, args.warmup, args.keys)
    driver = "coredis" if args.implementation == "coredis" else "redis"
    return {
        "client": f"limits {_version('limits')} FixedWindowRateLimiter, async+redis, "
        f"implementation={args.implementation} ({driver} {_version(driver)})",
        **result,
    }


def main() -> None:
    from cluster.web.serve import install_fast_loop

    parser = argparse.ArgumentParser(description="SDK vs the limits library: decisions/s")
    parser.add_argument("target", choices=("shardlimit", "limits"))
    parser.add_argument("--router", default="http://127.0.0.1:8080")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--implementation", choices=("coredis", "redispy"), default="coredis")
    parser.add_argument("--callers", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--keys", type=int, default=100_000)
    args = parser.parse_args()
    install_fast_loop()
    runner = run_shardlimit if args.target == "shardlimit" else run_limits
    print(json.dumps(asyncio.run(runner(args)), indent=2))


if __name__ == "__main__":
    main()
