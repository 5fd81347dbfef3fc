"""`burst`: many concurrent connections at once; is every admitted check held by a counter?

For 128, 256 and 512 connections, a closed-loop burst from its own process
(`cluster.local.loadgen`) on fresh keys, three workloads:

  hot    one key, fixed_window 2,000 per 1d, 3,000 requests (2,000 must pass)
  money  one key, calendar day UTC max_amount 100.00, 0.10 each, 1,100 requests (1,000)
  many   5,000 keys, fixed_window 3 per 1d, 20,000 requests (3 per key: 15,000)

After each burst the counters are read back through the router with cost-0 checks
(/v1/check/batch, 1,000 per request): `held_by_counters` is what they consumed (for money
the amount used ÷ 0.10). `admitted` counts answers allowed and not degraded. `exact` says
admitted == held, key by key. A degraded answer (the router's on_failure) is counted and
its reason tallied: under a correct cluster there are none and every run is exact.

    python -m bench.burst --router http://127.0.0.1:8080
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from bench.cpu import CpuWindow
from bench.progress import note
from cluster.local.loadgen import run_loadgen_sync

CONNECTIONS = (128, 256, 512)
READ_BATCH = 1000
DAY_S = 86_400


@dataclass(frozen=True)
class Workload:
    name: str
    limit: dict[str, Any]
    requests: int
    keys: int = 1
    amount: str | None = None  # money: each check's amount; counters hold amounts

    @property
    def expected_admitted(self) -> int:
        if self.amount is not None:
            return min(self.requests, int(Decimal(self.limit["max_amount"]) / Decimal(self.amount)))
        per_key = -(-self.requests // self.keys)
        return min(per_key, int(self.limit["limit"])) * self.keys

    def check(self, key: str, read: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {"key": key, "limits": [self.limit]}
        if read:
            body["cost"] = 0
        if self.amount is not None:
            body["amount"] = "0" if read else self.amount
        return body

    def key(self, prefix: str, index: int | str) -> str:
        return f"{prefix}:{self.name}:{index}"


WORKLOADS = (
    Workload("hot", {"algorithm": "fixed_window", "limit": 2000, "window": "1d"}, 3000),
    Workload(
        "money",
        {"algorithm": "calendar", "period": "day", "timezone": "UTC", "max_amount": "100.00"},
        1100,
        amount="0.10",
    ),
    Workload("many", {"algorithm": "fixed_window", "limit": 3, "window": "1d"}, 20_000, 5000),
)


def _post(url: str, body: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
    request = urllib.request.Request(  # noqa: S310 - our own router
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def read_held(
    router: str, workload: Workload, prefix: str, attempts: int = 10
) -> tuple[dict[str, int], int]:
    """({key: units its counter holds}, keys that could not be read) via cost-0 checks.

    A degraded read (a node still timing out, or its breaker still open after the burst)
    says nothing about the counter: it is retried after a pause.
    """
    pending = [workload.key(prefix, i) for i in range(workload.keys)]
    held: dict[str, int] = {}
    for attempt in range(attempts):
        if attempt:
            time.sleep(0.5)
        pending = [
            key
            for chunk in _chunks(pending, READ_BATCH)
            for key in _read_chunk(router, workload, chunk, held)
        ]
        if not pending:
            break
    return held, len(pending)


def _read_chunk(
    router: str, workload: Workload, keys: list[str], held: dict[str, int]
) -> list[str]:
    """Read one batch of counters into `held`; the keys whose read was degraded."""
    checks = [workload.check(key, read=True) for key in keys]
    answer = _post(f"{router}/v1/check/batch", {"checks": checks})
    failed = []
    for key, result in zip(keys, answer["results"], strict=True):
        used = _used(workload, result)
        if used is None:
            failed.append(key)
        else:
            held[key] = used
    return failed


def _used(workload: Workload, result: dict[str, Any]) -> int | None:
    """Units (checks) the counter holds, from one cost-0 answer; None when degraded."""
    view = result.get("limits", [{}])[0]
    if result.get("degraded"):
        return None
    if workload.amount is not None:
        if view.get("amount_remaining") is None:
            return None
        spent = Decimal(workload.limit["max_amount"]) - Decimal(view["amount_remaining"])
        return int(spent / Decimal(workload.amount))
    if view.get("remaining") is None:
        return None
    return int(workload.limit["limit"]) - int(view["remaining"])


def _crossed_utc_midnight(started: float) -> bool:
    """fixed_window 1d and calendar day UTC both restart at UTC midnight."""
    return int(started // DAY_S) != int(time.time() // DAY_S)


def one_run(router: str, workload: Workload, connections: int) -> dict[str, Any]:
    prefix = f"burst:{secrets.token_hex(4)}:c{connections}"
    template = json.dumps(workload.check(workload.key(prefix, "{i}")), separators=(",", ":"))
    started = time.time()
    with CpuWindow() as cpu:
        load = run_loadgen_sync(
            f"{router}/v1/check",
            connections=connections,
            body=template,
            requests=workload.requests,
            keys=workload.keys,
            per_key=True,
        )
    held, unreadable = read_held(router, workload, prefix)
    return summarize(workload, connections, load, held, unreadable) | {
        "crossed_utc_midnight": _crossed_utc_midnight(started),
        "cpu": cpu.result,
    }


def summarize(
    workload: Workload,
    connections: int,
    load: dict[str, Any],
    held: dict[str, int],
    unreadable: int,
) -> dict[str, Any]:
    admitted_by_key: dict[str, int] = load["allowed_by_key"]
    admitted = sum(admitted_by_key.values())
    keys = set(admitted_by_key) | set(held)
    mismatched = sum(1 for k in keys if admitted_by_key.get(k, 0) != held.get(k, 0))
    return {
        "connections": connections,
        "workload": workload.name,
        "requests": load["requests"],
        "answered": load["answered"],
        "errors": load["errors"],
        "error_samples": load["error_samples"][:3],
        "status": load["status"],
        "degraded": load["degraded"],
        "degraded_allowed": load["degraded_allowed"],
        "degraded_reasons": load["degraded_reasons"],
        "expected_admitted": workload.expected_admitted,
        "admitted": admitted,
        "allowed_total": load["allowed"],
        "held_by_counters": sum(held.values()),
        "unreadable_keys": unreadable,
        "mismatched_keys": mismatched,
        "exact": mismatched == 0 and unreadable == 0,
        "p50_ms": load["latency_ms"]["p50"],
        "p99_ms": load["latency_ms"]["p99"],
        "rate_per_s": load["rate_per_s"],
        "elapsed_s": load["elapsed_s"],
    }


def _progress(run: dict[str, Any]) -> None:
    note(
        f"burst c={run['connections']} {run['workload']}: admitted {run['admitted']}"
        f"/{run['expected_admitted']}, held {run['held_by_counters']}, exact {run['exact']},"
        f" degraded {run['degraded']}, errors {run['errors']}, p99 {run['p99_ms']} ms,"
        f" {run['rate_per_s']:.0f}/s"
    )


def burst(router: str, connections: tuple[int, ...] = CONNECTIONS) -> dict[str, Any]:
    """Every workload at every connection count; totals for the targets."""
    runs = []
    for count in connections:
        for workload in WORKLOADS:
            runs.append(one_run(router, workload, count))
            _progress(runs[-1])
    return {
        "runs": runs,
        "degraded_total": sum(r["degraded"] for r in runs),
        "errors_total": sum(r["errors"] for r in runs),
        "all_exact": int(all(r["exact"] for r in runs)),
        "settings": {
            "connections": list(connections),
            "workloads": {
                w.name: {
                    "limit": w.limit,
                    "requests": w.requests,
                    "keys": w.keys,
                    "amount": w.amount,
                }
                for w in WORKLOADS
            },
            "generator": "cluster.local.loadgen (own process, closed loop, keep-alive)",
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--router", required=True, help="e.g. http://127.0.0.1:8080")
    parser.add_argument("--connections", default=",".join(map(str, CONNECTIONS)))
    args = parser.parse_args(argv)
    counts = tuple(int(c) for c in args.connections.split(","))
    print(json.dumps(burst(args.router.rstrip("/"), counts), indent=2))


if __name__ == "__main__":
    main()
