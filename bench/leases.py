"""`leases`: acquire+release pairs per second ÷ fixed-window checks per second, same run.

On a scratch cluster of 3 nodes, two rules: `bench_fw` (a fixed window too large to
deny) and `bench_lease` (a concurrency limit too large to deny, leases of 30 s). Both
sides are driven by `bench.lease_pairs` in its own process, on the same lean client, over
the same 1,000 keys: checks of `bench_fw`, and pairs of a `bench_lease` check and the
release of its lease. A pair is two calls, so 0.5 is the ceiling a lease could reach
costing what a check costs; the target is 0.45.

Each round runs both sides back to back, the first side alternating; the ratio is the
median of the rounds' ratios (one lucky run does not move it).

    python -m bench.leases [--seconds 4] [--rounds 3] [--connections 64]
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from statistics import median
from typing import Any

from bench.compare import run_module_json, with_cpu
from bench.http import request
from bench.progress import note
from cluster.local.cluster import scratch_cluster

RULES = {
    "bench_fw": {"limits": [{"algorithm": "fixed_window", "limit": 10**9, "window": "1h"}]},
    "bench_lease": {"limits": [{"algorithm": "concurrency", "limit": 100_000, "lease": "30s"}]},
}
SIDES = ("checks", "pairs")


def _side(router: str, side: str, seconds: float, connections: int) -> dict[str, Any]:
    args = ["--url", router, "--seconds", str(seconds), "--connections", str(connections)]
    if side == "checks":
        args += ["--rule", "bench_fw", "--checks"]
    else:
        args += ["--rule", "bench_lease"]
    return run_module_json("bench.lease_pairs", *args, timeout=seconds * 10 + 60)


def leases(seconds: float = 4.0, rounds: int = 3, connections: int = 64) -> dict[str, Any]:
    with scratch_cluster(3, log_level="WARNING") as cluster:
        router = cluster.router_url
        for name, doc in RULES.items():
            request(f"{router}/v1/rules/{name}", "PUT", doc, cluster.admin_token)
        for side in SIDES:
            note(f"leases: warming up {side}")
            _side(router, side, 1.0, connections)
        runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
        for r in range(rounds):
            for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                result = with_cpu(partial(_side, router, side, seconds, connections))
                note(f"leases: round {r + 1} {side}: {result['per_s']:,.0f}/s")
                runs[side].append(result)
    paired = [
        round(p["per_s"] / c["per_s"], 3)
        for c, p in zip(runs["checks"], runs["pairs"], strict=True)
        if c["per_s"]
    ]
    return {
        "load_generator": {
            "tool": "bench.lease_pairs",
            "connections": connections,
            "seconds": seconds,
            "keys": 1000,
        },
        "checks_per_s": max(x["per_s"] for x in runs["checks"]),
        "pairs_per_s": max(x["per_s"] for x in runs["pairs"]),
        "ratio": median(paired) if paired else None,
        "round_ratios": paired,
        "denied": sum(x["denied"] for side in SIDES for x in runs[side]),
        "errors": sum(x["errors"] for side in SIDES for x in runs[side]),
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.leases", description=__doc__)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=64)
    args = parser.parse_args()
    print(json.dumps(leases(args.seconds, args.rounds, args.connections), indent=2))


if __name__ == "__main__":
    main()
