"""The ceiling of one Redis on this machine: `redis-benchmark -P 32` running EVALSHA of a
one-INCR script on random keys, against a bare redis-server (the cluster's binary).

The script is loaded with `redis-cli SCRIPT LOAD` first; redis-benchmark then sends
`EVALSHA <sha> 1 key:__rand_int__` with `-r` random keys, pipelined 32 deep by 50
clients: 1,600 calls in flight, which the `batch` piece matches on the router's side.
"""

from __future__ import annotations

import csv
import io
import subprocess
from typing import Any

from bench.env import require_tool
from bench.peers import bare_redis
from cluster.local.procs import child_preexec

INCR_SCRIPT = "return redis.call('INCR', KEYS[1])"
PIPELINE = 32
CLIENTS = 50
IN_FLIGHT = PIPELINE * CLIENTS  # calls redis-benchmark keeps outstanding


def evalsha_benchmark(
    requests: int = 2_000_000,
    keys: int = 100_000,
    pipeline: int = PIPELINE,
    clients: int = CLIENTS,
) -> dict[str, Any]:
    """Requests/s of EVALSHA (one INCR) on a fresh bare Redis."""
    cli, bench = require_tool("redis-cli"), require_tool("redis-benchmark")
    with bare_redis() as server:
        port = str(server.port)
        sha = subprocess.run(
            [cli, "-p", port, "SCRIPT", "LOAD", INCR_SCRIPT],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
            preexec_fn=child_preexec,
        ).stdout.strip()
        args = [
            bench,
            "-p",
            port,
            "-P",
            str(pipeline),
            "-c",
            str(clients),
            "-n",
            str(requests),
            "-r",
            str(keys),
            "--csv",
            "EVALSHA",
            sha,
            "1",
            "key:__rand_int__",
        ]
        out = subprocess.run(
            args, check=True, capture_output=True, text=True, timeout=300, preexec_fn=child_preexec
        )
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    if not rows:
        raise RuntimeError(f"redis-benchmark printed no result: {out.stdout!r} {out.stderr!r}")
    row = rows[-1]
    return {
        "command": f"redis-benchmark -P {pipeline} -c {clients} -n {requests} -r {keys} "
        f"EVALSHA <sha of {INCR_SCRIPT!r}> 1 key:__rand_int__",
        "requests_per_s": float(row["rps"]),
        "p50_ms": float(row["p50_latency_ms"]),
        "p99_ms": float(row["p99_latency_ms"]),
        "script_sha": sha,
        "in_flight": pipeline * clients,
    }
