"""Envoy + shardlimit ÷ Envoy alone: one Envoy binary and bootstrap, with and without
`envoy.filters.http.ratelimit`, in the same run.

Starts a scratch cluster (3 nodes, the router's gRPC port, one `rate_limit` descriptor
`user` of 1e9 an hour, so every request reaches a node and none is denied) and three
Envoys from cluster/local/envoy_proc.py, each with `--concurrency 1` and a backend listener
of its own (a direct 200): *alone* proxies every request to its backend; *with shardlimit*
first asks the router over gRPC with one descriptor from the request's `x-user` header
(`failure_mode_deny: true`, so an unanswered check is a 500, never a free pass); *with
instant service* makes the same call to bench/instant_rls.py, which answers OK at once
(the price of the filter's call with nothing behind it). Then:

1. throughput: wrk (1 thread, 64 connections, `x-user` a random one of 100,000 keys) on
   each Envoy in rounds that alternate the order; the ratio of 2xx answers per second,
   with shardlimit ÷ alone (the target), and each of the other two ratios;
2. latency: the open-loop generator (bench/openloop.py's, its own process, requests of
   this module's shape) at one fixed rate on each Envoy: p50/p99/p999 from the scheduled
   send time;
3. CPU per request by process (envoy, router, nodes, redis; /proc) over a window inside
   each open-loop run ÷ the requests Envoy answered in it (`http.ingress.downstream_rq_total`);
   the alone run's router, nodes and Redis figures are their idle work, and
   `added_by_shardlimit` is the difference.

    .venv/bin/python -m bench.gateway [--seconds 10] [--rate 200] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from statistics import mean
from typing import Any

from bench.compare import abba, ratio, with_cpu
from bench.cpu import CLK_TCK, below, outside_ticks, process_table, role_of
from bench.env import python_env
from bench.instant_rls import instant_service
from bench.openloop import OpenLoop, OpenLoopConfig
from bench.progress import note
from bench.wrk import TALLY_LUA, WrkSettings, run_wrk
from cluster.local.cluster import scratch_cluster
from cluster.local.envoy_proc import EnvoyProcess, RateLimitFilter, envoy_binary
from cluster.local.ports import free_port
from cluster.local.procs import child_preexec, python_module

DOMAIN = "bench"
HEADER = "x-user"
CONFIG = f"""
domain: {DOMAIN}
descriptors:
  - key: user
    rate_limit: {{unit: hour, requests_per_unit: 1000000000}}
"""
SIDES = ("alone", "with_shardlimit", "with_instant_service")
ROLES = ("envoy", "router", "nodes", "redis", "instant service")
WARMUP_S = 1.0  # the open-loop driver's first second, sent but not measured
SETTLE_S = 2.5  # from the driver's spawn to its CPU window: start-up and warm-up
ANSWERED = "http.ingress.downstream_rq_total"  # requests the front listener answered


@dataclass(frozen=True)
class Options:
    seconds: float = 10.0
    rounds: int = 2
    rate: float = 200.0  # the open-loop rate, requests/s, on both Envoys (well under capacity)
    keys: int = 100_000
    connections: int = 64
    concurrency: int = 1  # Envoy's worker threads
    timeout_s: float = 1.0  # the rate-limit call's timeout in Envoy
    warmup_seconds: float = 2.0


def header_script(keys: int) -> str:
    """wrk: GET / with `x-user` one random key of `keys` per request."""
    return (
        f"local KEYS, PER_REQUEST = {keys}, 1\n"
        "function request()\n"
        f'  return wrk.format("GET", "/", {{["{HEADER}"] = tostring(math.random(0, KEYS - 1))}})\n'
        "end\n" + TALLY_LUA
    )


def encoded_requests(url: str, keys: int, count: int = 20_000, seed: int = 1) -> list[bytes]:
    """The open-loop generator's requests: GET / with a random `x-user`, ready to write."""
    host = url.removeprefix("http://").rstrip("/").encode()
    rng = random.Random(seed)
    return [
        b"GET / HTTP/1.1\r\nHost: %s\r\n%s: %d\r\n\r\n"
        % (host, HEADER.encode(), rng.randrange(keys))
        for _ in range(count)
    ]


async def drive(url: str, rate: float, seconds: float, keys: int) -> dict[str, Any]:
    """One open-loop run (in its own process) against an Envoy."""
    loop = OpenLoop(OpenLoopConfig(url, rate, seconds, WARMUP_S, distinct_requests=1))
    loop.requests = encoded_requests(url, keys)
    return await loop.run()


@dataclass
class CpuSnapshot:
    """CPU seconds by role below this process, and the requests Envoy answered, now."""

    at: float
    seconds: dict[str, float]
    requests: int
    table: dict[int, tuple[int, int]]  # every process: (parent pid, CPU ticks)
    ours: set[int]  # the pids below this process

    @classmethod
    def take(cls, envoy: EnvoyProcess, roles: dict[int, str]) -> CpuSnapshot:
        table = process_table()
        ours = below(os.getpid(), table)
        used: dict[str, float] = {}
        for pid in ours:
            role = roles.setdefault(pid, role_of(pid))
            used[role] = used.get(role, 0.0) + table[pid][1] / CLK_TCK
        answered = envoy.stats(ANSWERED)[ANSWERED]
        return cls(time.monotonic(), used, answered, table, ours)


def cpu_per_request(before: CpuSnapshot, after: CpuSnapshot) -> dict[str, Any]:
    """Cores and µs of CPU per answered request by role between two snapshots (idle work
    of a role, such as the nodes' probes, included)."""
    requests = max(1, after.requests - before.requests)
    elapsed = after.at - before.at
    every = {role: after.seconds[role] - before.seconds.get(role, 0.0) for role in after.seconds}
    used = {role: every.get(role, 0.0) for role in ROLES}
    outside = outside_ticks(before.table, after.table, before.ours | after.ours) / CLK_TCK
    return {
        "window_s": round(elapsed, 2),
        "requests": requests,
        "cores": {role: round(used[role] / elapsed, 3) for role in ROLES},
        "us_per_request": {role: round(used[role] / requests * 1e6, 1) for role in ROLES},
        "machine_busy_cores": round((sum(every.values()) + outside) / elapsed, 2),
        "outside_this_benchmark_cores": round(outside / elapsed, 2),
    }


def envoy_ratelimit_stats(envoy: EnvoyProcess) -> dict[str, int]:
    prefix = "cluster.backend.ratelimit."
    return {k.removeprefix(prefix): v for k, v in envoy.stats(prefix).items()}


def throughput(urls: dict[str, str], options: Options) -> dict[str, Any]:
    script = header_script(options.keys)
    settings = WrkSettings(threads=1, connections=options.connections, seconds=options.seconds)
    for side, url in urls.items():
        note(f"gateway: warming up {side} ({options.warmup_seconds:g} s)")
        run_wrk(url, script, replace(settings, seconds=options.warmup_seconds))
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for r, side in abba(options.rounds, list(SIDES)):
        result = with_cpu(partial(run_wrk, urls[side], script, settings))
        result["ok_per_s"] = round(result["ok_2xx"] / result["seconds"], 1)
        note(
            f"gateway: round {r} {side}: {result['ok_per_s']:,.0f} 2xx/s "
            f"({result['other_status']} other status, {result['denied_429']} 429)"
        )
        runs[side].append({"round": r, **result})
    rates = {side: mean(x["ok_per_s"] for x in runs[side]) for side in SIDES}
    instant = rates["with_instant_service"]
    return {
        "load_generator": {
            "tool": "wrk",
            **settings.to_dict(),
            "request": f"GET / with {HEADER}: one random key of {options.keys:,}",
        },
        "envoy_alone_per_s": round(rates["alone"], 1),
        "with_shardlimit_per_s": round(rates["with_shardlimit"], 1),
        "with_instant_service_per_s": round(instant, 1),
        "ratio": ratio(rates["with_shardlimit"], rates["alone"]),
        "instant_service_vs_alone": ratio(instant, rates["alone"]),
        "shardlimit_vs_instant_service": ratio(rates["with_shardlimit"], instant),
        "non_2xx": {
            side: sum(x["other_status"] + x["denied_429"] for x in runs[side]) for side in SIDES
        },
        "runs": runs,
    }


def open_loop(envoys: dict[str, EnvoyProcess], options: Options) -> dict[str, Any]:
    """Each Envoy at the same fixed rate; CPU by role over a window inside each run."""
    out: dict[str, Any] = {"rate_per_s": options.rate}
    roles: dict[int, str] = {}
    for side in SIDES:
        args = ["drive", "--url", envoys[side].url, "--rate", str(options.rate)]
        args += ["--seconds", f"{options.seconds:g}", "--keys", str(options.keys)]
        driver = subprocess.Popen(
            python_module("bench.gateway", *args),
            stdout=subprocess.PIPE,
            text=True,
            env=python_env(),
            preexec_fn=child_preexec,
        )
        try:
            time.sleep(SETTLE_S)  # the driver's start-up and its warm-up second
            before = CpuSnapshot.take(envoys[side], roles)
            time.sleep(max(1.0, options.seconds - 1.0))
            after = CpuSnapshot.take(envoys[side], roles)
            stdout, _ = driver.communicate(timeout=options.seconds + 120)
        finally:
            if driver.poll() is None:
                driver.kill()
        if driver.returncode != 0:
            raise RuntimeError(f"the open-loop driver exited with {driver.returncode}")
        result: dict[str, Any] = json.loads(stdout)
        result["cpu_by_process"] = cpu_per_request(before, after)
        note(
            f"gateway: open loop {side} at {options.rate:g}/s: p50 {result['p50_ms']} ms, "
            f"p99 {result['p99_ms']} ms, status {result['status']}, "
            f"CPU us/request {result['cpu_by_process']['us_per_request']}"
        )
        out[side] = result
    out["p99_ms"] = {side: out[side]["p99_ms"] for side in SIDES}
    return out


def measure(options: Options) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sl-gateway-") as tmp:
        work = Path(tmp)
        config = work / "ratelimit.yaml"
        config.write_text(CONFIG)
        note("gateway: starting a local cluster (router with gRPC, 3 nodes, 3 Redis) and 3 Envoys")
        with (
            scratch_cluster(
                3, grpc_port=free_port(), envoy_config=config, log_level="WARNING"
            ) as local,
            instant_service() as instant_port,
        ):
            assert local.options.grpc_port is not None
            limit = partial(
                RateLimitFilter,
                domain=DOMAIN,
                headers=((HEADER, "user"),),
                failure_mode_deny=True,
                timeout_s=options.timeout_s,
            )
            envoys = {
                side: EnvoyProcess(work, filter_, concurrency=options.concurrency)
                for side, filter_ in (
                    ("alone", None),
                    ("with_shardlimit", limit(grpc_port=local.options.grpc_port)),
                    ("with_instant_service", limit(grpc_port=instant_port)),
                )
            }
            try:
                for envoy in envoys.values():
                    envoy.start()
                return _measure(envoys, options)
            finally:
                for envoy in envoys.values():
                    envoy.stop()


def _measure(envoys: dict[str, EnvoyProcess], options: Options) -> dict[str, Any]:
    urls = {side: envoy.url for side, envoy in envoys.items()}
    result: dict[str, Any] = {
        "envoy": str(envoy_binary()),
        "envoy_concurrency": options.concurrency,
        "ratelimit_timeout_s": options.timeout_s,
        "throughput": throughput(urls, options),
        "open_loop": open_loop(envoys, options),
    }
    result["ratio"] = result["throughput"]["ratio"]
    cpu = {side: result["open_loop"][side]["cpu_by_process"]["us_per_request"] for side in SIDES}
    for side, added in (
        ("with_shardlimit", "added_by_shardlimit"),
        ("with_instant_service", "added_by_instant_service"),
    ):
        cpu[added] = {role: round(cpu[side][role] - cpu["alone"][role], 1) for role in ROLES}
    result["cpu_us_per_request"] = cpu
    result["envoy_ratelimit_stats"] = envoy_ratelimit_stats(envoys["with_shardlimit"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode")
    one = sub.add_parser("drive", help="(internal) one open-loop run, in its own process")
    one.add_argument("--url", required=True)
    for p in (parser, one):
        p.add_argument("--seconds", type=float, default=10.0)
        p.add_argument("--rate", type=float, default=200.0, help="open-loop requests/s")
        p.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2, help="ABBA rounds of wrk")
    parser.add_argument("--connections", type=int, default=64, help="wrk connections")
    parser.add_argument("--concurrency", type=int, default=1, help="Envoy worker threads")
    args = parser.parse_args()
    if args.mode == "drive":
        from cluster.web.serve import install_fast_loop

        install_fast_loop()
        gc.collect()
        gc.disable()  # no collector pauses inside the measurement
        print(json.dumps(asyncio.run(drive(args.url, args.rate, args.seconds, args.keys))))
        return
    options = Options(
        seconds=args.seconds,
        rounds=args.rounds,
        rate=args.rate,
        keys=args.keys,
        connections=args.connections,
        concurrency=args.concurrency,
    )
    print(json.dumps(measure(options), indent=2))


if __name__ == "__main__":
    main()
