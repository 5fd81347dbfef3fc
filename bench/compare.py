"""The side-by-side comparisons of `make bench`: each a ratio measured in the same run.

1. single checks through the router ÷ a trivial aiohttp handler (wrk, same settings);
2. decisions/s through /v1/check/batch ÷ redis-benchmark EVALSHA on one bare Redis;
3. the async SDK ÷ the `limits` library (64 concurrent callers each);
4. open-loop latency at a fixed rate through the router, and the same generator against
   the trivial handler (its floor) and against the same decision in one process over one
   Redis (bench.one_redis).

Rounds alternate which side goes first (ABBA) so a drift in the machine's load hits both
sides alike; every measurement carries the CPU split of its window (`bench.cpu`).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from statistics import mean, median
from typing import Any

import redis

from bench.cpu import CpuWindow
from bench.env import python_env
from bench.one_redis import one_redis_server
from bench.openloop import OpenLoopConfig
from bench.peers import bare_redis
from bench.progress import note
from bench.redisbench import IN_FLIGHT, evalsha_benchmark
from bench.wrk import WrkSettings, batch_script, check_script, run_wrk
from cluster.local.procs import child_preexec, python_module

BATCH_SIZE = 100  # checks per /v1/check/batch request
# wrk connections of the batch piece: as many decisions in flight as redis-benchmark keeps
# calls in flight on the other side (16 x 100 = 50 clients x 32 pipelined).
BATCH_CONNECTIONS = -(-IN_FLIGHT // BATCH_SIZE)


@dataclass(frozen=True)
class Settings:
    seconds: float = 10.0
    rounds: int = 2
    keys: int = 100_000
    warmup_seconds: float = 2.0
    single: WrkSettings = field(default_factory=lambda: WrkSettings(threads=1, connections=64))
    batch: WrkSettings = field(
        default_factory=lambda: WrkSettings(threads=1, connections=BATCH_CONNECTIONS)
    )
    batch_size: int = BATCH_SIZE
    redis_requests: int = 2_000_000
    sdk_callers: int = 64
    rate: float = 1000.0  # the headline open-loop rate
    extra_rates: tuple[float, ...] = (3000.0,)  # also measured
    latency_rounds: int = 3  # open-loop rounds of floor, one-Redis and router per rate

    def wrk_single(self) -> WrkSettings:
        return replace(self.single, seconds=self.seconds)

    def wrk_batch(self) -> WrkSettings:
        return replace(self.batch, seconds=self.seconds)


def with_cpu(
    run: Callable[[], dict[str, Any]], interval: float | None = CpuWindow.interval
) -> dict[str, Any]:
    """Run one measurement; attach the cores each process role used meanwhile
    (`interval`: bench.cpu.CpuWindow's)."""
    with CpuWindow(interval=interval) as cpu:
        result = run()
    result["cpu"] = cpu.result
    return result


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def run_module_json(module: str, *args: str, timeout: float = 600) -> dict[str, Any]:
    """`python -m module args`: its stdout is one JSON document."""
    out = subprocess.run(
        python_module(module, *args),
        check=True,
        capture_output=True,
        text=True,
        env=python_env(),
        timeout=timeout,
        preexec_fn=child_preexec,
    ).stdout
    result: dict[str, Any] = json.loads(out[out.index("{") :])
    return result


def abba(rounds: int, sides: list[str]) -> list[tuple[int, str]]:
    """(round, side) in an order that alternates which side goes first."""
    order = []
    for r in range(rounds):
        order += [(r + 1, side) for side in (sides if r % 2 == 0 else sides[::-1])]
    return order


# --------------------------------------------------------------------------- 1. single


def single_check(router: str, trivial: str, s: Settings) -> dict[str, Any]:
    script = check_script(s.keys)
    urls = {"router": router + "/v1/check", "trivial": trivial + "/v1/check"}
    for side, url in urls.items():
        note(f"single: warming up {side} ({s.warmup_seconds:g} s)")
        run_wrk(url, script, replace(s.single, seconds=s.warmup_seconds))
    runs: dict[str, list[dict[str, Any]]] = {"router": [], "trivial": []}
    for r, side in abba(s.rounds, ["router", "trivial"]):
        result = with_cpu(partial(run_wrk, urls[side], script, s.wrk_single()))
        note(
            f"single: round {r} {side}: {result['served_decisions_per_s']:,.0f} checks/s "
            f"({result['degraded']} degraded, {result['other_status']} other status)"
        )
        runs[side].append({"round": r, **result})
    router_rate = mean(x["served_decisions_per_s"] for x in runs["router"])
    trivial_rate = mean(x["served_decisions_per_s"] for x in runs["trivial"])
    return {
        "load_generator": {
            "tool": "wrk",
            **s.wrk_single().to_dict(),
            "body": f"POST /v1/check, one random key of {s.keys:,}, fixed_window limit 1e9 / 1h",
        },
        "router_checks_per_s": round(router_rate, 1),
        "trivial_requests_per_s": round(trivial_rate, 1),
        "ratio": ratio(router_rate, trivial_rate),
        "router_degraded": sum(x["degraded"] for x in runs["router"]),
        "router_non_2xx_429": sum(x["other_status"] for x in runs["router"]),
        "router_socket_errors": sum(sum(x["socket_errors"].values()) for x in runs["router"]),
        "runs": runs,
    }


# --------------------------------------------------------------------------- 2. batch


def batch_load(router: str, s: Settings) -> dict[str, Any]:
    """wrk POSTing batches of `batch_size` random checks (the body built in Lua)."""
    return run_wrk(router + "/v1/check/batch", batch_script(s.keys, s.batch_size), s.wrk_batch())


def batch_vs_redis(router: str, s: Settings) -> dict[str, Any]:
    note(f"batch: warming up ({s.warmup_seconds:g} s)")
    run_wrk(
        router + "/v1/check/batch",
        batch_script(s.keys, s.batch_size),
        replace(s.batch, seconds=s.warmup_seconds),
    )
    runs: dict[str, list[dict[str, Any]]] = {"router": [], "redis": []}
    for r, side in abba(s.rounds, ["router", "redis"]):
        if side == "router":
            result = with_cpu(partial(batch_load, router, s))
            note(
                f"batch: round {r} router: {result['served_decisions_per_s']:,.0f} decisions/s "
                f"({result['degraded']} degraded)"
            )
        else:
            result = with_cpu(partial(evalsha_benchmark, s.redis_requests, s.keys))
            note(f"batch: round {r} redis-benchmark EVALSHA: {result['requests_per_s']:,.0f}/s")
        runs[side].append({"round": r, **result})
    router_rate = mean(x["served_decisions_per_s"] for x in runs["router"])
    redis_rate = mean(x["requests_per_s"] for x in runs["redis"])
    return {
        "load_generator": {
            "tool": "wrk (Lua builds each body)",
            **s.wrk_batch().to_dict(),
            "batch": s.batch_size,
            "keys": s.keys,
        },
        "in_flight": {"router": s.batch.connections * s.batch_size, "redis": IN_FLIGHT},
        "router_decisions_per_s": round(router_rate, 1),
        "redis_evalsha_per_s": round(redis_rate, 1),
        "ratio": ratio(router_rate, redis_rate),
        "router_degraded": sum(x["degraded"] for x in runs["router"]),
        "router_non_200": sum(x["other_status"] + x["denied_429"] for x in runs["router"]),
        "runs": runs,
    }


# --------------------------------------------------------------------------- 3. SDK vs limits


def sdk_vs_limits(router: str, s: Settings) -> dict[str, Any]:
    common = ["--callers", str(s.sdk_callers), "--seconds", f"{s.seconds:g}", "--keys", str(s.keys)]
    runs: dict[str, list[dict[str, Any]]] = {"sdk": [], "limits": [], "limits_redispy": []}
    with bare_redis() as server:
        flush = redis.Redis(port=server.port)
        commands = {
            "sdk": ["shardlimit", "--router", router, *common],
            "limits": ["limits", "--redis", server.url, *common],
            "limits_redispy": [
                "limits",
                "--redis",
                server.url,
                "--implementation",
                "redispy",
                *common,
            ],
        }
        try:
            for r, side in abba(s.rounds, list(commands)):
                flush.flushall()
                result = with_cpu(partial(run_module_json, "bench.sdk", *commands[side]))
                note(f"sdk: round {r} {side}: {result['served_decisions_per_s']:,.0f} decisions/s")
                runs[side].append({"round": r, **result})
        finally:
            flush.close()
    rates = {side: mean(x["served_decisions_per_s"] for x in rs) for side, rs in runs.items()}
    best = max(("limits", "limits_redispy"), key=lambda side: rates[side])
    return {
        "callers": s.sdk_callers,
        "seconds": s.seconds,
        "limit": "fixed window, 100 per minute, random keys",
        "sdk_decisions_per_s": round(rates["sdk"], 1),
        "limits_decisions_per_s": round(rates["limits"], 1),
        "limits_redispy_decisions_per_s": round(rates["limits_redispy"], 1),
        "ratio": ratio(rates["sdk"], rates["limits"]),
        "ratio_vs_best_limits": ratio(rates["sdk"], rates[best]),
        "best_limits": best,
        "sdk_degraded": sum(x["degraded"] for x in runs["sdk"]),
        "sdk_errors": sum(x["errors"] for x in runs["sdk"]),
        "runs": runs,
    }


# --------------------------------------------------------------------------- 4. latency


def _open_loop_round(
    urls: dict[str, str], args: list[str], rate: float, order: tuple[str, ...]
) -> dict[str, dict[str, Any]]:
    """One run of each side at one offered rate, in `order`; each with its CPU window."""
    got_by_side: dict[str, dict[str, Any]] = {}
    for side in order:
        # Sampled at its ends only: a sample's walk of /proc would delay the checks timed.
        run = partial(run_module_json, "bench.openloop", "--url", urls[side], *args)
        got = with_cpu(run, interval=None)
        note(
            f"latency at {rate:g}/s: {side}: p50 {got['p50_ms']} ms, p99 {got['p99_ms']} ms, "
            f"p999 {got['p999_ms']} ms ({got['degraded']} degraded)"
        )
        got_by_side[side] = got
    return got_by_side


def round_figures(got: dict[str, dict[str, Any]], rate: float) -> dict[str, Any]:
    """The router against the floor (the trivial handler) and the one-Redis baseline
    measured beside it in the same round."""
    router_result, floor, one = got["router"], got["floor"], got["one-Redis"]
    cpu = cpu_per_check(router_result.get("cpu"), rate, SERVICE_ROLES)
    floor_cpu = cpu_per_check(floor.get("cpu"), rate, FLOOR_ROLES)
    one_cpu = cpu_per_check(one.get("cpu"), rate, ONE_REDIS_ROLES)
    return {
        "p50_ms": router_result["p50_ms"],
        "p99_ms": router_result["p99_ms"],
        "p999_ms": router_result["p999_ms"],
        "floor_p50_ms": floor["p50_ms"],
        "floor_p99_ms": floor["p99_ms"],
        "floor_p999_ms": floor["p999_ms"],
        "p99_over_floor_ms": _over(router_result["p99_ms"], floor["p99_ms"]),
        "p999_over_floor_ms": _over(router_result["p999_ms"], floor["p999_ms"]),
        "p99_vs_floor": _ratio_of(router_result["p99_ms"], floor["p99_ms"]),
        "p999_vs_floor": _ratio_of(router_result["p999_ms"], floor["p999_ms"]),
        "cpu_usec_per_check": cpu,
        "floor_cpu_usec_per_request": floor_cpu,
        # every process a check crosses ÷ the one process a trivial request crosses
        "cpu_vs_floor": _ratio_of(_total(cpu), _total(floor_cpu)),
        # What that CPU is made of: at this rate nothing batches, so each check wakes
        # each process it crosses (bench.cpu counts the sleeps of their main threads).
        "wakeups_per_check": wakeups_per_check(router_result.get("cpu"), rate, SERVICE_ROLES),
        "floor_wakeups_per_request": wakeups_per_check(floor.get("cpu"), rate, FLOOR_ROLES),
        # The same decision in one process over one Redis: the router ÷ it is what the
        # router and node hops cost; it ÷ the floor is what one Redis round trip costs.
        "one_redis_p50_ms": one["p50_ms"],
        "one_redis_p99_ms": one["p99_ms"],
        "one_redis_p999_ms": one["p999_ms"],
        "one_redis_cpu_usec_per_check": one_cpu,
        "one_redis_wakeups_per_check": wakeups_per_check(one.get("cpu"), rate, ONE_REDIS_ROLES),
        "one_redis_p99_vs_floor": _ratio_of(one["p99_ms"], floor["p99_ms"]),
        "one_redis_cpu_vs_floor": _ratio_of(_total(one_cpu), _total(floor_cpu)),
        "p99_vs_one_redis": _ratio_of(router_result["p99_ms"], one["p99_ms"]),
        "cpu_vs_one_redis": _ratio_of(_total(cpu), _total(one_cpu)),
        "degraded": router_result["degraded"],
    }


def _outside_cores(got: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """Cores other work on the machine took during each side's run (bench.cpu)."""
    return {
        side: (run.get("cpu") or {}).get("outside_this_benchmark_cores")
        for side, run in got.items()
    }


def median_figures(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the rounds (a ratio: the median of the rounds' ratios;
    by role too, so the parts of a median need not add up to its total)."""
    merged: dict[str, Any] = {}
    for key in rounds[0]:
        values = [r.get(key) for r in rounds]
        if any(isinstance(v, dict) for v in values):
            merged[key] = median_figures([v for v in values if isinstance(v, dict)])
        elif key == "degraded":
            merged[key] = sum(values)
        else:
            known = [v for v in values if v is not None]
            merged[key] = round(median(known), 3) if known else None
    return merged


def _open_loop_rate(
    urls: dict[str, str], s: Settings, rate: float
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The router, the trivial handler (the generator's floor) and the one-Redis baseline
    (bench.one_redis) at one offered rate, in `s.latency_rounds` rounds.

    A round runs the three sides back to back, every other round in reverse order, and
    its ratios are between its own runs. With one run a side, one disturbed run decided
    a figure (the CPU ratio of the same code moved between 3.8 and 8.9 from run to run);
    the figures are now the medians of the rounds', so one disturbed round does not.
    The raw runs kept are the median round's by p99 ratio."""
    config = OpenLoopConfig(url=urls["router"], rate=rate, seconds=s.seconds, keys=s.keys)
    args = [
        "--rate",
        f"{rate:g}",
        "--seconds",
        f"{s.seconds:g}",
        "--warmup",
        f"{config.warmup:g}",
        "--keys",
        str(s.keys),
    ]
    sides = ("floor", "one-Redis", "router")
    runs = [
        _open_loop_round(urls, args, rate, sides if r % 2 == 0 else sides[::-1])
        for r in range(s.latency_rounds)
    ]
    figures = [round_figures(got, rate) for got in runs]
    by_p99 = sorted(range(len(runs)), key=lambda r: figures[r]["p99_vs_floor"] or 0.0)
    middle = runs[by_p99[len(by_p99) // 2]]
    raw = {
        "router": middle["router"],
        "floor_trivial_aiohttp": middle["floor"],
        "one_redis": middle["one-Redis"],
    }
    summary = {
        "rate_per_s": rate,
        **median_figures(figures),
        "rounds": [
            {key: f[key] for key in ROUND_KEYS}
            | {"order": list(got), "outside_cores": _outside_cores(got)}
            for f, got in zip(figures, runs, strict=True)
        ],
    }
    return summary, raw


# The processes a check costs: the router, the nodes and their Redis (not the generator).
SERVICE_ROLES = ("router", "nodes", "redis")
ONE_REDIS_ROLES = ("one-Redis aiohttp", "one-Redis redis")
FLOOR_ROLES = ("trivial aiohttp",)
# What each round's entry keeps (all of a round's figures make its medians).
ROUND_KEYS = (
    "p99_ms",
    "floor_p99_ms",
    "p99_vs_floor",
    "p999_vs_floor",
    "cpu_usec_per_check",
    "floor_cpu_usec_per_request",
    "cpu_vs_floor",
    "one_redis_cpu_vs_floor",
)


def _total(per_check: dict[str, float] | None) -> float | None:
    return per_check["total"] if per_check else None


def _over(value: float | None, floor: float | None) -> float | None:
    return None if value is None or floor is None else round(value - floor, 3)


def _ratio_of(value: float | None, floor: float | None) -> float | None:
    return None if value is None or not floor else round(value / floor, 3)


def cpu_per_check(cpu: Any, rate: float, roles: tuple[str, ...]) -> dict[str, float] | None:
    """CPU microseconds per check at an open-loop rate, by role and in total, from the
    run's /proc window (bench.cpu): cores used ÷ checks per second."""
    if not isinstance(cpu, dict):
        return None
    return _per_check(cpu.get("cores", {}), 1e6, rate, roles, digits=1)


def wakeups_per_check(cpu: Any, rate: float, roles: tuple[str, ...]) -> dict[str, float] | None:
    """Process wake-ups per check at an open-loop rate, by role and in total, from the
    run's /proc window (bench.cpu `wakeups_per_s`) ÷ checks per second."""
    if not isinstance(cpu, dict) or "wakeups_per_s" not in cpu:
        return None
    return _per_check(cpu["wakeups_per_s"], 1, rate, roles, digits=2)


def _per_check(
    per_s: dict[str, float], scale: float, rate: float, roles: tuple[str, ...], *, digits: int
) -> dict[str, float] | None:
    """`per_s[role] * scale` ÷ checks per second, by role and in total."""
    if rate <= 0:
        return None
    per_role = {role: round(per_s.get(role, 0) * scale / rate, digits) for role in roles}
    return {**per_role, "total": round(sum(per_role.values()), digits)}


def open_loop_latency(router: str, trivial: str, s: Settings) -> dict[str, Any]:
    """The headline rate's figures at the top level; every rate under `by_rate`."""
    with one_redis_server() as one_redis:
        urls = {"router": router, "floor": trivial, "one-Redis": one_redis}
        by_rate = {
            f"{rate:g}": _open_loop_rate(urls, s, rate)
            for rate in (s.rate, *[r for r in s.extra_rates if r != s.rate])
        }
    headline, raw = by_rate[f"{s.rate:g}"]
    return {
        "load_generator": {
            "tool": "bench.openloop: asyncio Protocols + uvloop, pre-encoded HTTP/1.1, "
            "keep-alive pool (a new connection when all are busy), sends paced by a timerfd",
            "rates_per_s": [float(rate) for rate in by_rate],
            "seconds": s.seconds,
            "warmup_seconds": OpenLoopConfig(url=router).warmup,
            "rounds": s.latency_rounds,
        },
        **headline,
        **raw,
        "by_rate": {
            rate: summary | {"router_cpu": raw_runs["router"].get("cpu")}
            for rate, (summary, raw_runs) in by_rate.items()
        },
    }
