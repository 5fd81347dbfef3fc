"""Migration speed and check latency during a live reshard, against raw MIGRATE.

Starts 4 Redis, 4 node processes and a router process (3 nodes in the ring, the
4th added live), fills N fixed-window counters directly into their owners'
Redis, measures check latency at a fixed offered rate before and during the
migration, and compares keys moved per second with `MIGRATE ... KEYS` batches
between two bare Redis instances in the same run; then removes the 4th node again (its
keys all move back). `--cycles` add-and-remove cycles run in turn: keys/s are pooled
over each kind of move (keys moved ÷ seconds), and the checks of every move are pooled
for the p99 during (one move's probe holds ~250 checks, so its p99 is its 3rd-slowest
check). Prints JSON; writes bench/runs/migration.json (`--out DIR` elsewhere).

    python -m bench.migration --keys 200000 [--partitioner slots]
    python -m bench.migration --keys 1000000   # the 1M-key cluster, 3 -> 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.cpu import CpuWindow
from bench.openloop import OpenLoop, OpenLoopConfig, percentile_ms
from cluster.local.cluster import node_process, router_process
from cluster.local.procs import ChildProcess
from cluster.local.redis_proc import RedisProcess, free_port
from cluster.model.keys import counter_key
from cluster.model.nodes import NodeSpec
from cluster.model.partition import new_partitioner
from cluster.web.serve import install_fast_loop
from cluster.wire.control import COPY_BUSY_PCT

TOKEN = "bench-token"
SHAPE = "fw:3600000"
RESULTS = Path(__file__).parent / "runs"  # git-ignored
# How often the piece asks `GET /v1/cluster` whether a move is done: the cadence of the
# product's own watchers (/ui, the router's epoch poll). Each call asks every node for its
# stats; asked every 0.1 s, that work was a large part of the live checks' p99 during a
# move, which the probe before never paid (bench/README.md, `migration`). The move's
# time is the router's own figure (`seconds`), not the poll's.
STATUS_POLL_S = 0.5
# What a fixed_window counter holds: its count, a plain integer (node/store/lua/fixed_window.lua).
COUNT = 1


def fill(servers: dict[str, RedisProcess], owner_of: Any, keys: int) -> None:
    clients = {n: redis.Redis(port=s.port) for n, s in servers.items()}
    pipes = {n: c.pipeline(transaction=False) for n, c in clients.items()}
    for i in range(keys):
        key = f"user:{i}"
        pipes[owner_of(key)].set(counter_key("basic", SHAPE, key), COUNT, px=3_600_000)
        if i % 10_000 == 9_999:
            for pipe in pipes.values():
                pipe.execute()
    for pipe in pipes.values():
        pipe.execute()
    for client in clients.values():
        client.close()


def raw_migrate(keys: int, tmp: Path, batch: int, name: str = "raw") -> float:
    """Keys/s of MIGRATE ... KEYS between two bare Redis: the physical limit here."""
    source = RedisProcess(port=free_port(), data_dir=tmp / f"{name}-src", aof=False)
    target = RedisProcess(port=free_port(), data_dir=tmp / f"{name}-dst", aof=False)
    source.start()
    target.start()
    try:
        src = redis.Redis(port=source.port)
        pipe = src.pipeline(transaction=False)
        names = [counter_key("basic", SHAPE, f"user:{i}") for i in range(keys)]
        for i, name in enumerate(names):
            pipe.set(name, COUNT, px=3_600_000)
            if i % 10_000 == 9_999:
                pipe.execute()
        pipe.execute()
        started = time.perf_counter()
        for start in range(0, keys, batch):
            chunk = names[start : start + batch]
            src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *chunk)  # type: ignore[no-untyped-call]
        elapsed = time.perf_counter() - started
        assert redis.Redis(port=target.port).dbsize() == keys
        src.close()
        return keys / elapsed
    finally:
        source.stop()
        target.stop()


async def latency_probe(
    router: str, seconds: float, rate: float, stop: asyncio.Event | None = None
) -> tuple[dict[str, Any], list[float]]:
    """Open loop (bench.openloop): one check every 1/rate s regardless of answers, latency
    from each check's scheduled send time. Its summary, and every latency in seconds
    (unanswered checks with the time they had waited), to pool runs."""
    config = OpenLoopConfig(url=router, rate=rate, seconds=seconds, warmup=0.0, keys=200_000)
    probe = OpenLoop(config, stop)
    summary = await probe.run()
    return summary, [*probe.latency, *probe.unanswered_waits]


def pooled(latencies: list[float]) -> dict[str, Any]:
    ordered = sorted(latencies)
    return {
        "checks": len(ordered),
        "p50_ms": percentile_ms(ordered, 0.5),
        "p99_ms": percentile_ms(ordered, 0.99),
        "p999_ms": percentile_ms(ordered, 0.999),
        "max_ms": percentile_ms(ordered, 1.0),
    }


async def first_touches(http: aiohttp.ClientSession, nodes: list[str]) -> dict[str, int]:
    """First touches so far, over all nodes, by where the moving keys were read (the
    source node's export endpoint, or the source's Redis)."""
    reads = {"node": 0, "redis": 0}
    for url in nodes:
        async with http.get(url + "/metrics") as resp:
            text = await resp.text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "shardlimit_node_pull_reads_total":
                    reads[sample.labels["source"]] += int(sample.value)
    return reads


async def move(
    http: aiohttp.ClientSession,
    router: str,
    method: str,
    path: str,
    body: Any,
    args: argparse.Namespace,
    nodes: list[str],
) -> dict[str, Any]:
    """One live reshard (`method path body` starts it), under the open-loop probe; its
    progress figures, CPU per key moved by role, and the probe's latencies."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    touched = await first_touches(http, nodes)
    # CPU over the whole move, by role: sampled only at its ends (no process starts or
    # stops meanwhile), as a walk of /proc would hold up the probe in this process.
    with CpuWindow(interval=None) as cpu:
        asked = time.monotonic()
        async with http.request(method, router + path, json=body, headers=headers) as resp:
            assert resp.status == 202, await resp.text()
        stop = asyncio.Event()
        probe = asyncio.create_task(latency_probe(router, 3600, args.rate, stop))
        deadline = time.monotonic() + args.timeout
        try:
            while True:
                async with http.get(router + "/v1/cluster") as resp:
                    migration = (await resp.json())["migration"]
                if migration and migration["phase"] == "done" and not migration["running"]:
                    whole_move = time.monotonic() - asked
                    break
                if migration and migration.get("phase") == "paused":
                    raise RuntimeError(f"migration paused: {migration.get('last_error')}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"migration not done within {args.timeout:g} s: {migration}")
                await asyncio.sleep(STATUS_POLL_S)  # polling progress
        finally:
            stop.set()
            during, latencies = await probe
    moved = migration["keys_moved"]
    touched_after = await first_touches(http, nodes)
    return {
        "keys_moved": moved,
        "migration_seconds": migration["seconds"],
        "whole_move_seconds": round(whole_move, 2),  # the request -> done
        "moved_keys_per_s": round(moved / migration["seconds"]),
        "sources": migration.get("sources"),
        "cpu_us_per_key_moved": {
            role: round(cores * cpu.result["seconds"] * 1e6 / max(moved, 1), 2)
            for role, cores in cpu.result["cores"].items()
        },
        "cpu_cores_during_move": cpu.result["cores"],
        "latency_during": during,
        "first_touch_reads": {k: touched_after[k] - touched[k] for k in touched},
        "_latencies": latencies,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="sl-bench-migration-"))
    try:
        return await _run(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def _run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    # Raw MIGRATE is measured just before and just after the cluster runs: on a shared
    # machine one measurement alone can land in a quiet or a busy moment.
    raw_before = raw_migrate(args.keys, tmp, args.migrate_batch, "raw-before")
    env = dict(
        os.environ,
        SHARDLIMIT_CLUSTER_TOKEN=TOKEN,
        SHARDLIMIT_ADMIN_TOKEN=TOKEN,
        SHARDLIMIT_LOG_LEVEL="WARNING",
    )
    servers = {
        f"n{i}": RedisProcess(port=free_port(), data_dir=tmp / f"r{i}", aof=False)
        for i in range(1, 5)
    }
    procs: list[ChildProcess] = []
    cycles: list[dict[str, dict[str, Any]]] = []
    try:
        for server in servers.values():
            server.start()
        specs = []
        for node_id, server in servers.items():
            port = free_port()
            specs.append(NodeSpec(node_id, f"http://127.0.0.1:{port}"))
            procs.append(node_process(node_id, port, server.url, env=env))
            procs[-1].spawn()
        for proc in procs:
            await proc.wait_ready_async()
        part = new_partitioner(args.partitioner, specs[:3])
        fill({s.id: servers[s.id] for s in specs[:3]}, part.owner, args.keys)
        router_port = free_port()
        router = f"http://127.0.0.1:{router_port}"
        config = {
            "router": {
                "port": router_port,
                "data_dir": str(tmp / "router"),
                "node_deadline": "1s",
                "reshard_step_keys": args.step,
                "reshard_rate": args.reshard_rate,
                "reshard_busy_pct": args.busy_pct,
                "reshard_parallel": args.parallel,
            },
            "cluster": {"partitioner": args.partitioner, "nodes": [s.to_dict() for s in specs[:3]]},
        }
        (tmp / "cluster.yaml").write_text(yaml.safe_dump(config))
        procs.append(router_process("router", tmp / "cluster.yaml", router, env=env))
        await procs[-1].start_async()
        before, _ = await latency_probe(router, args.probe_seconds, args.rate)
        urls = [spec.url for spec in specs]
        async with aiohttp.ClientSession() as http:
            # Scaling up (3 -> 4: each source scans all its keys, a quarter of them move)
            # and back down (4 -> 3: every key of the one source moves).
            for _ in range(args.cycles):
                cycles.append(
                    {
                        "add": await move(
                            http,
                            router,
                            "POST",
                            "/v1/cluster/nodes",
                            specs[3].to_dict(),
                            args,
                            urls,
                        ),
                        "remove": await move(
                            http, router, "DELETE", "/v1/cluster/nodes/n4", None, args, urls
                        ),
                    }
                )
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            proc.wait_stopped(grace=10)
        for server in servers.values():
            server.stop()
    raw_after = raw_migrate(args.keys, tmp, args.migrate_batch, "raw-after")
    raw = (raw_before + raw_after) / 2
    during = pooled([t for c in cycles for m in c.values() for t in m.pop("_latencies")])
    for cycle in cycles:
        for figures in cycle.values():
            figures["ratio_vs_raw_migrate"] = round(figures["moved_keys_per_s"] / raw, 3)
    added, removed = (pooled_speed([c[kind] for c in cycles], raw) for kind in ("add", "remove"))
    return {
        "keys": args.keys,
        "partitioner": args.partitioner,
        "reshard_rate": args.reshard_rate,
        "busy_pct": args.busy_pct,
        "parallel": args.parallel,
        "cycles": args.cycles,
        "raw_migrate_keys_per_s": round(raw),
        "raw_migrate_before_after": [round(raw_before), round(raw_after)],
        # The target: scaling up, the move that scans the most per key moved.
        "ratio_vs_raw_migrate": added["ratio_vs_raw_migrate"],
        "ratio_remove_vs_raw_migrate": removed["ratio_vs_raw_migrate"],
        "add": added,
        "remove": removed,
        "moves": cycles,
        "latency_before": before,
        "latency_during": during,  # every move's checks pooled
        "p99_during_over_before": round(during["p99_ms"] / before["p99_ms"], 2)
        if during["p99_ms"] and before["p99_ms"]
        else None,
    }


def pooled_speed(moves: list[dict[str, Any]], raw: float) -> dict[str, Any]:
    """Keys/s over moves of one kind (all their keys ÷ all their seconds), ÷ raw MIGRATE."""
    keys = sum(m["keys_moved"] for m in moves)
    seconds = sum(m["migration_seconds"] for m in moves)
    rate = keys / seconds if seconds else 0.0
    return {
        "keys_moved": keys,
        "migration_seconds": round(seconds, 3),
        "moved_keys_per_s": round(rate),
        "ratio_vs_raw_migrate": round(rate / raw, 3),
        "ratio_by_move": [m["ratio_vs_raw_migrate"] for m in moves],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--partitioner", choices=("ring", "slots"), default="ring")
    parser.add_argument("--step", type=int, default=20_000, help="keys examined per copy step")
    parser.add_argument(
        "--reshard-rate", type=int, default=0, help="keys/s budget of the copy (0: none)"
    )
    parser.add_argument("--parallel", type=int, default=1, help="sources copying at once")
    parser.add_argument(
        "--busy-pct",
        type=int,
        default=COPY_BUSY_PCT,
        help="most of a source Redis' time the copy may take",
    )
    parser.add_argument("--migrate-batch", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--probe-seconds", type=float, default=6.0, help="the probe before")
    parser.add_argument("--cycles", type=int, default=3, help="add-and-remove cycles")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up on the migration")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where migration.json goes")
    install_fast_loop()
    args = parser.parse_args()
    result = asyncio.run(run(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "migration.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
