"""Decisions/s through /v1/check/batch with 1, 2 and 4 nodes (each its own fresh cluster).

The load is the batch load of comparison 2 (wrk, Lua-built batches of random keys), so
the figures line up with `batch.router_decisions_per_s`. On this 2-core machine every
node and Redis shares the same two cores with the router and wrk: more nodes add
parallel Redis and node processes, not CPU (the `cpu` split of each run shows it).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from bench.compare import Settings, batch_load, ratio, with_cpu
from bench.progress import note
from bench.wrk import batch_script, run_wrk
from cluster.local.cluster import scratch_cluster


def scaling(s: Settings, node_counts: tuple[int, ...] = (1, 2, 4)) -> dict[str, Any]:
    runs: dict[str, dict[str, Any]] = {}
    for nodes in node_counts:
        note(f"scaling: starting a cluster of {nodes} node(s)")
        with scratch_cluster(nodes, log_level="WARNING") as local:
            router = local.router_url
            run_wrk(
                router + "/v1/check/batch",
                batch_script(s.keys, s.batch_size),
                replace(s.batch, seconds=s.warmup_seconds),
            )
            result = with_cpu(partial(batch_load, router, s))
        note(
            f"scaling: {nodes} node(s): {result['served_decisions_per_s']:,.0f} decisions/s "
            f"({result['degraded']} degraded)"
        )
        runs[str(nodes)] = result
    base = runs[str(node_counts[0])]["served_decisions_per_s"]
    return {
        "load_generator": {
            "tool": "wrk (same batch load as comparison 2)",
            **s.wrk_batch().to_dict(),
            "batch": s.batch_size,
        },
        "decisions_per_s": {n: r["served_decisions_per_s"] for n, r in runs.items()},
        "relative_to_1_node": {
            n: ratio(r["served_decisions_per_s"], base) for n, r in runs.items()
        },
        "degraded": {n: r["degraded"] for n, r in runs.items()},
        "runs": runs,
    }
