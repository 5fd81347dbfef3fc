"""Where a check's CPU goes: py-spy samples of the router and one node under open-loop load.

Runs single checks at a fixed rate (bench.openloop) against a running cluster while
`py-spy record --nonblocking` samples the router process and one node process, then
reduces the raw stacks to shares of *busy* samples (idle event-loop waits left out):
by layer (the package of the innermost frame) and the top innermost frames.

    python -m bench.profile --router http://127.0.0.1:8080 --data-dir DIR --node-port 7001
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from bench.openloop import OpenLoopConfig, open_loop
from cluster.local.procs import command_lines

PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
# Innermost frames that mean "waiting in the event loop" (uvloop's poll is native code).
IDLE = ("Runner.run (asyncio/runners.py", "Condition.wait (threading.py")
LAYERS = (
    (
        "socket writes (send syscalls)",
        ("writelines", "_writelines", "send (router/channel/control_client"),
    ),
    ("aiohttp", ("aiohttp/",)),
    ("redis-py", ("redis/",)),
    ("asyncio", ("asyncio/",)),
    ("router (ours)", ("router/",)),
    ("node (ours)", ("node/",)),
    ("cluster (ours)", ("cluster/",)),
)


def pids_of(patterns: dict[str, str]) -> dict[str, int]:
    """First process whose command line contains each pattern."""
    found: dict[str, int] = {}
    for pid, cmdline in command_lines():
        for name, pattern in patterns.items():
            if name not in found and pattern in cmdline and "py-spy" not in cmdline:
                found[name] = pid
    return found


def layer_of(frame: str) -> str:
    for layer, needles in LAYERS:
        if any(n in frame for n in needles):
            return layer
    return "other"


def summarize(raw: str, top: int = 12) -> dict[str, Any]:
    leaves: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            leaves[stack.split(";")[-1]] += int(count)
    total = sum(leaves.values())
    busy = {f: n for f, n in leaves.items() if not f.startswith(IDLE)}
    busy_total = sum(busy.values()) or 1
    layers: Counter[str] = Counter()
    for frame, n in busy.items():
        layers[layer_of(frame)] += n
    return {
        "samples": total,
        "busy_share": round(busy_total / total, 3) if total else 0.0,
        "busy_by_layer": {k: round(v / busy_total, 3) for k, v in layers.most_common()},
        "top_busy_frames": [
            {"frame": f, "share": round(n / busy_total, 3)}
            for f, n in Counter(busy).most_common(top)
        ],
    }


async def profile(
    router: str, pids: dict[str, int], seconds: float, rate: float, out_dir: Path
) -> dict[str, Any]:
    def start_spy(name: str, pid: int) -> subprocess.Popen[bytes]:
        output = str(out_dir / f"{name}.txt")
        args = [
            PY_SPY,
            "record",
            "--nonblocking",
            "--format",
            "raw",
            "--rate",
            "250",
            "--duration",
            str(int(seconds)),
            "--pid",
            str(pid),
            "--output",
            output,
        ]
        return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    spies = {name: start_spy(name, pid) for name, pid in pids.items()}
    try:
        load = await open_loop(OpenLoopConfig(url=router, rate=rate, seconds=seconds + 1))
    finally:
        for spy in spies.values():
            spy.wait(seconds + 30)
    result: dict[str, Any] = {
        "load": {k: load[k] for k in ("offered_per_s", "p50_ms", "p99_ms", "degraded")},
        "sampler": "py-spy record --nonblocking --rate 250 (innermost Python frame)",
    }
    for name in pids:
        path = out_dir / f"{name}.txt"
        result[name] = summarize(path.read_text()) if path.exists() else {"error": "no samples"}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--router", required=True)
    parser.add_argument("--data-dir", required=True, help="the cluster's data dir (finds pids)")
    parser.add_argument("--node-port", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=1000.0)
    args = parser.parse_args()
    pids = pids_of(
        {
            "router": f"cluster.cli serve router --config {args.data_dir}",
            "node": f"--port {args.node_port} --redis",
        }
    )
    with tempfile.TemporaryDirectory(prefix="sl-bench-profile-") as tmp:
        result = asyncio.run(profile(args.router, pids, args.seconds, args.rate, Path(tmp)))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
