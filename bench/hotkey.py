"""`hotkey`: one hot key under load, with `spread: 1` and `spread: 3`, on 3 nodes.

For each spread, a rule with a quota too large to run out is put, and one key is
hammered from a load generator in its own process (`cluster.local.loadgen`, closed loop).
Each node's share of the key's operations is the growth of the router's
`shardlimit_node_ops` counter for that node over the run (the only traffic then), so
`max_share` is 1.0 when one node serves the key alone and 1/3 when the key's
sub-counters sit on three nodes and take turns. Decisions/s is the loadgen's rate.

On this 2-core machine shared by router, nodes, Redis and the generator, throughput
cannot grow with nodes: the balance is the figure of merit. Where sub-counters land
is the partitioner's choice (each `key#i` is placed on its own), so with 3 sub-counters
on 3 nodes two may share a node; `sub_counter_nodes` shows where they are.

    python -m bench.hotkey [--seconds 5] [--connections 64]
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any
from urllib.parse import quote

from bench.http import request
from bench.progress import note
from cluster.local.cluster import scratch_cluster
from cluster.local.loadgen import run_loadgen_sync
from cluster.model.keys import sub_key

SPREADS = (1, 3)
KEY = "hot:item"
_OPS = re.compile(r'^shardlimit_node_ops(?:_total)?\{[^}]*node="([^"]+)"[^}]*\}\s+(\S+)$', re.M)


def node_ops(router: str) -> dict[str, float]:
    text = request(router + "/metrics")
    ops: dict[str, float] = {}
    for node, value in _OPS.findall(text):
        ops[node] = ops.get(node, 0.0) + float(value)
    return ops


def measure(
    router: str, token: str, spread: int, seconds: float, connections: int
) -> dict[str, Any]:
    rule = f"hot_s{spread}"
    doc = {"limits": [{"algorithm": "quota", "limit": 10**12}], "spread": spread}
    request(f"{router}/v1/rules/{rule}", "PUT", doc, token)
    keys = [sub_key(KEY, i) for i in range(spread)] if spread > 1 else [KEY]
    placed = [request(f"{router}/v1/locate?key={quote(k)}")["node"] for k in keys]
    before = node_ops(router)
    body = json.dumps({"key": KEY, "rule": rule})
    report = run_loadgen_sync(
        router + "/v1/check", connections=connections, body=body, duration_s=seconds
    )
    after = node_ops(router)
    grown = {node: after.get(node, 0.0) - before.get(node, 0.0) for node in after}
    total = sum(grown.values()) or 1.0
    shares = {node: round(ops / total, 3) for node, ops in sorted(grown.items())}
    return {
        "spread": spread,
        "decisions_per_s": round(report["rate_per_s"]),
        "allowed": report["allowed"],
        "degraded": report["degraded"],
        "errors": report["errors"],
        "node_shares": shares,
        "max_share": max(shares.values()),
        "sub_counter_nodes": placed,
        "p99_ms": report["latency_ms"]["p99"],
    }


def hotkey(seconds: float = 5.0, connections: int = 64) -> dict[str, Any]:
    out: dict[str, Any] = {
        "note": "2 shared cores: throughput cannot scale with nodes; the balance is the figure "
        "of merit",
    }
    with scratch_cluster(3, log_level="WARNING") as cluster:
        for spread in SPREADS:
            note(f"hotkey: spread {spread}, {seconds:.0f} s, {connections} connections")
            out[f"spread_{spread}"] = measure(
                cluster.router_url, cluster.admin_token, spread, seconds, connections
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.hotkey", description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=64)
    args = parser.parse_args()
    print(json.dumps(hotkey(args.seconds, args.connections), indent=2))


if __name__ == "__main__":
    main()
