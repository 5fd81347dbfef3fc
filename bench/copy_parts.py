"""The parts of one source's copy, each alone, against raw MIGRATE in the same run.

One Redis holds the counters a node `n1` owns of N keys on a ring of 3 nodes; `n4` joins.
In this process, with no live traffic, no budget and no router:
- `find`: the copy's finder (node/migration/copy_step.py `Finder`) over the whole
  keyspace, the next SCAN sent while the last one's names are classified;
- `copy`: the moving names, known beforehand, copied to a second Redis by the copy's mover
  (node/migration/direct.py `DirectMover.copy_chunk`, MOVE_CHUNK keys a call);
- `step`: both at once, as a copy step runs them (`copy_step`; its budget, `--busy-pct`,
  times the calls here, as a node does where Redis will not tell its own time).

Each part reports keys moved per second ÷ raw `MIGRATE ... KEYS` (1,000 a call, between two
bare Redis, measured before each round) and CPU µs by process: what a find that never
examines the names that stay would leave, and what the copy step costs before a live
cluster adds to it. Prints JSON.

    python -m bench.copy_parts --keys 200000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import redis
import redis.asyncio as aioredis

from bench.cpu import cpu_seconds
from bench.migration import COUNT, SHAPE, raw_migrate
from cluster.local.ports import free_port
from cluster.local.redis_proc import RedisProcess
from cluster.model.keys import counter_key
from cluster.model.nodes import NodeSpec
from cluster.model.partition import new_partitioner
from cluster.model.topology import Topology
from cluster.web.serve import install_fast_loop
from cluster.wire.control import COPY_BUSY_PCT
from node.migration.copy_step import FIND_BATCH, MOVE_CHUNK, Budget, Finder, copy_step
from node.migration.direct import DirectMover
from node.migration.peer_client import PeerClient, RedisAddress
from node.migration.peer_redis import PeerRedis
from node.store.redispy_pipe import own_sender
from node.topology.ownership import Ownership

NODES = [NodeSpec(f"n{i}", f"http://127.0.0.1:{9000 + i}") for i in range(1, 5)]


def ownership() -> Ownership:
    old = new_partitioner("ring", NODES[:3])
    return Ownership.build(
        "n1", Topology(2, old.resized(NODES), {"id": "m", "from": old.to_dict()})
    )


def fill(server: RedisProcess, keys: int) -> int:
    """n1's share of `keys` counters, as the nodes write them; how many."""
    ring = new_partitioner("ring", NODES[:3])
    client = redis.Redis(port=server.port)
    client.flushall()
    pipe = client.pipeline(transaction=False)
    for i in range(keys):
        key = f"user:{i}"
        if ring.owner(key) == "n1":
            pipe.set(counter_key("basic", SHAPE, key), COUNT, px=3_600_000)
    held = len(pipe.execute())
    client.close()
    return held


class Part:
    """Times one part: wall seconds, and CPU seconds of this process and each Redis."""

    def __init__(self, servers: dict[str, RedisProcess]) -> None:
        self.pids = {name: server.proc.pid for name, server in servers.items() if server.proc}

    async def run(self, work: Callable[[], Awaitable[int]]) -> dict[str, Any]:
        cpu = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        node, began = time.process_time(), time.perf_counter()
        moved = await work()
        wall = time.perf_counter() - began
        used = {name: cpu_seconds(pid) - cpu[name] for name, pid in self.pids.items()}
        used["node"] = time.process_time() - node
        return {
            "moved": moved,
            "seconds": round(wall, 4),
            "keys_per_s": round(moved / wall),
            "cpu_us_per_key_moved": {k: round(v / moved * 1e6, 2) for k, v in used.items()},
        }


async def one_round(tmp: Path, keys: int, busy_pct: int) -> dict[str, Any]:
    source = RedisProcess(port=free_port(), data_dir=tmp / "source", aof=False)
    target = RedisProcess(port=free_port(), data_dir=tmp / "target", aof=False)
    source.start()
    target.start()
    client = aioredis.Redis(port=source.port)
    sender = own_sender(client)
    peers = PeerClient(aiohttp.ClientSession, cluster_token=None)
    peer_redis = PeerRedis(peers)
    mover = DirectMover(peers, peer_redis, sender)
    address: RedisAddress = (target.host, target.port, 0)
    part = Part({"source redis": source, "target redis": target})
    moving: list[str] = []
    try:
        held = fill(source, keys)

        async def find() -> int:
            finder = Finder(client, ownership(), sender)
            cursor = 0
            while True:
                cursor, _, found = await finder.find(cursor, FIND_BATCH, 10**9)
                moving.extend(found.get("n4", []))
                if cursor == 0:
                    return len(moving)

        async def copy() -> int:
            for start in range(0, len(moving), MOVE_CHUNK):
                await mover.copy_chunk(address, moving[start : start + MOVE_CHUNK], keep=False)
            return len(moving)

        async def move(_target: str, chunk: list[str]) -> int:
            await mover.copy_chunk(address, chunk, keep=False)
            return len(chunk)

        async def step() -> int:
            answer = await copy_step(
                Finder(client, ownership(), sender), move, 0, 10**9, Budget(busy_pct=busy_pct)
            )
            return int(answer["moved"])

        found = await part.run(find)
        copied = await part.run(copy)
        landed = redis.Redis(port=target.port)
        assert (await client.dbsize(), landed.dbsize()) == (held - len(moving), len(moving))
        landed.flushall()
        fill(source, keys)
        stepped = await part.run(step)
        assert (await client.dbsize(), landed.dbsize()) == (held - len(moving), len(moving))
        landed.close()
        return {"holds": held, "find": found, "copy": copied, "step": stepped}
    finally:
        await sender.close()
        await peer_redis.close()
        await client.aclose()
        source.stop()
        target.stop()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rounds = []
    for index in range(args.rounds):
        tmp = Path(tempfile.mkdtemp(prefix="copy-parts-"))
        try:
            raw = raw_migrate(args.raw_keys, tmp, 1000)
            parts = await one_round(tmp, args.keys, args.busy_pct)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        for name in ("find", "copy", "step"):
            figures = parts[name]
            figures["ratio_vs_raw_migrate"] = round(figures["keys_per_s"] / raw, 3)
        rounds.append({"round": index + 1, "raw_migrate_keys_per_s": round(raw), **parts})
    medians = {
        name: statistics.median(r[name]["ratio_vs_raw_migrate"] for r in rounds)
        for name in ("find", "copy", "step")
    }
    return {
        "keys": args.keys,
        "busy_pct": args.busy_pct,
        "medians_vs_raw_migrate": medians,
        "rounds": rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000, help="counters of the 3 nodes")
    parser.add_argument("--raw-keys", type=int, default=50_000, help="keys raw MIGRATE moves")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--busy-pct", type=int, default=COPY_BUSY_PCT, help="the step's budget (100: none)"
    )
    args = parser.parse_args()
    install_fast_loop()
    print(json.dumps(asyncio.run(run(args)), indent=2))


if __name__ == "__main__":
    main()
