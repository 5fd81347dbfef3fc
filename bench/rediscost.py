"""Redis CPU time per decision: INFO commandstats usec ÷ decisions, per algorithm.

The node sends every check of a batch to its Redis as one script call
(node/store/lua/batch.lua); this measures what that costs Redis per decision, for
batches of 1 and of 100 checks on distinct keys, against one INCR script as the
floor of any scripted decision.

python -m bench.rediscost --decisions 20000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from bench.memory import SPECS
from cluster.local.redis_proc import RedisProcess, free_port
from cluster.wire import Op as WireOp
from node.batch.ops import parse_op
from node.store.counter_store import CounterStore

BATCH_SIZES = (1, 100)


async def _script_usec(client: aioredis.Redis) -> tuple[int, int]:
    """(usec, calls) of EVALSHA and EVAL so far."""
    stats = await client.info("commandstats")
    usec = calls = 0
    for name in ("cmdstat_evalsha", "cmdstat_eval"):
        if name in stats:
            usec += int(stats[name]["usec"])
            calls += int(stats[name]["calls"])
    return usec, calls


async def _per_decision(
    client: aioredis.Redis, store: CounterStore, decisions: int, batch: int, wire: Any
) -> dict[str, float]:
    await client.flushall()
    await client.config_resetstat()
    for start in range(0, decisions, batch):
        ops = [
            parse_op(WireOp("check", f"user:{i}", "api", [wire], [0], cost=1))
            for i in range(start, min(decisions, start + batch))
        ]
        results = await store.run(ops)
        failed = [r for r in results if isinstance(r, Exception)]
        assert not failed, failed[:1]
    usec, calls = await _script_usec(client)
    return {"usec_per_decision": round(usec / decisions, 2), "script_calls": calls}


async def measure(decisions: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sl-bench-rediscost-") as tmp:
        server = RedisProcess(port=free_port(), data_dir=Path(tmp), aof=False)
        client = aioredis.Redis(port=server.port)
        store = CounterStore(client)
        try:
            server.start()
            version = (await client.info("server"))["redis_version"]
            out: dict[str, Any] = {}
            for name, spec in SPECS.items():
                out[name] = {
                    f"batch_{size}": await _per_decision(
                        client, store, decisions, size, spec.to_wire()
                    )
                    for size in BATCH_SIZES
                }
            # The floor: one script doing one INCR per call.
            await client.flushall()
            await client.config_resetstat()
            incr = client.register_script("return redis.call('INCR', KEYS[1])")
            for i in range(decisions):
                await incr(keys=[f"k:{i}"])
            usec, _ = await _script_usec(client)
        finally:
            await client.aclose()
            server.stop()
    fixed = out["fixed_window"]["batch_100"]["usec_per_decision"]
    return {
        "redis_version": version,
        "decisions": decisions,
        "by_algorithm": out,
        "incr_script_usec_per_call": round(usec / decisions, 2),
        "fixed_window_usec_per_decision": fixed,
        "fixed_window_vs_incr_script": round(fixed / max(usec / decisions, 0.01), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--decisions", type=int, default=20_000)
    print(json.dumps(asyncio.run(measure(parser.parse_args().decisions)), indent=2))


if __name__ == "__main__":
    main()
