"""`make bench`: run the benchmarks that exist so far and write bench/results/latest.json.

Today: migration speed vs raw MIGRATE with latency before/during (bench/migration.py),
a closed-loop throughput probe through a local cluster (bench/quick.py) and Redis
memory per counter (bench/memory.py). The
side-by-side suite of issue 4 (wrk, redis-benchmark, the `limits` library) is not
built yet.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.migration import latency_probe

RESULTS = Path(__file__).parent / "results"


def run_json(args: list[str]) -> Any:
    out = subprocess.run(
        [sys.executable, "-m", *args], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out[out.index("{") :])


def quick_through_local_cluster() -> Any:
    data_dir = Path(tempfile.mkdtemp(prefix="sl-bench-up-"))
    env = dict(os.environ, SHARDLIMIT_LOG_LEVEL="WARNING")
    up = subprocess.Popen(
        [sys.executable, "-m", "cluster.cli", "up", "--json", "--port", "18080",
         "--base-port", "17001", "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        assert up.stdout is not None
        info = json.loads(up.stdout.readline())
        quick = run_json(["bench.quick", "--router", info["router"], "--seconds", "5",
                          "--concurrency", "16", "--batch-concurrency", "2"])  # fmt: skip
        # Open loop at a fixed offered rate: latency not hidden by coordinated omission.
        quick["open_loop_1000_per_s"] = asyncio.run(
            latency_probe(info["router"], seconds=10, rate=1000)
        )
        return quick
    finally:
        up.terminate()
        up.wait(30)


def main() -> None:
    started = time.time()
    result = {
        "quick": quick_through_local_cluster(),
        "migration": run_json(["bench.migration", "--keys", "200000"]),
        "memory": run_json(["bench.memory", "--keys", "100000"]),
        "seconds": round(time.time() - started, 1),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latest.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
