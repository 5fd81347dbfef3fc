"""`make bench` / `shardlimit bench`: the whole benchmark suite in one go.

Starts what it needs (a local 3-node cluster, a trivial aiohttp handler, bare Redis,
clusters of 1, 2 and 4 nodes), runs every piece, stops everything (also on error), and
writes bench/runs/latest.json and latest.png (untracked: a run leaves the checkout clean;
`make bench-record` writes them to bench/results, the figures the docs quote). stdout carries one JSON
document (or, with --table, a table of the targets); progress goes to stderr.

Pieces (`--only NAME[,NAME]`, `--skip NAME[,NAME]`):

  single     /v1/check through the router ÷ a trivial aiohttp handler (wrk)
  batch      /v1/check/batch decisions/s ÷ redis-benchmark -P 32 EVALSHA (wrk)
  sdk        the async SDK ÷ the `limits` library, 64 concurrent callers each
  latency    open-loop p50/p99/p999 at 1,000 and 3,000 checks/s, and the generator's floor
  quick      the closed-loop aiohttp probe (bench/quick.py)
  memory     Redis bytes per counter (bench/memory.py)
  rediscost  Redis CPU usec per decision, INFO commandstats (bench/rediscost.py)
  scaling    batch decisions/s with 1, 2 and 4 nodes
  migration  live reshard speed ÷ raw MIGRATE, latency before/during (bench/migration.py)
  profile    py-spy samples of the router and a node at 1,000 checks/s (bench/profile.py)
  burst      128/256/512 connections at once: degraded answers, admitted == held (bench/burst.py)
  hotkey     one hot key with spread 1 and 3 on 3 nodes: each node's share, decisions/s
             (bench/hotkey.py)
  durability shards with a replica and Sentinel: `durability: replica` ÷ `primary` checks/s
             (single and batch, wrk), time from SIGKILL of a primary to the first normal
             answer (5 kills), acknowledged decisions lost (bench/durability.py)
  grpc       router CPU per ShouldRateLimit ÷ per /v1/check at 500/s open loop (bench/grpc_cost.py)
  gateway    a real Envoy with its rate-limit filter asking shardlimit ÷ the same Envoy alone
             (and asking a service that answers at once): 2xx/s (wrk), open-loop p99, CPU
             per request by process (bench/gateway.py)

Each comparison is a ratio of two measurements taken side by side in this run: the
machine has 2 shared cores, so absolute numbers are noise and only ratios mean much.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import compare
from bench.burst import burst
from bench.chart import draw
from bench.compare import BATCH_CONNECTIONS, BATCH_SIZE, Settings, run_module_json
from bench.durability import durability
from bench.hotkey import hotkey
from bench.leases import leases
from bench.peers import trivial_server
from bench.progress import note
from bench.scaling import scaling
from bench.targets import targets
from bench.wrk import WrkSettings
from cluster.local.cluster import LocalCluster, scratch_cluster
from cluster.local.redis_proc import redis_server_binary

RESULTS = Path(__file__).parent / "runs"  # git-ignored; bench/results: `make bench-record`
PIECES = (
    "single",
    "batch",
    "sdk",
    "latency",
    "quick",
    "profile",
    "burst",
    "memory",
    "rediscost",
    "scaling",
    "migration",
    "hotkey",
    "durability",
    "grpc",
    "gateway",
    "leases",
)
ON_SHARED_CLUSTER = {"single", "batch", "sdk", "latency", "quick", "profile", "burst"}
NEEDS_TRIVIAL = {"single", "latency"}
TOOLS = {
    "single": ["wrk"],
    "batch": ["wrk", "redis-benchmark", "redis-cli"],
    "scaling": ["wrk"],
    "profile": ["py-spy"],
    "durability": ["wrk"],
    "gateway": ["wrk"],
}


def _names(value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = sorted(set(names) - set(PIECES))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown piece(s) {unknown}; choose from {PIECES}")
    return names


def _rates(value: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in value.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"rates are numbers separated by commas: {exc}") from exc


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="shardlimit benchmark suite (writes bench/runs/latest.json and .png)",
        epilog="pieces: " + ", ".join(PIECES),
    )
    parser.add_argument("--only", type=_names, help="run only these pieces, e.g. single,batch")
    parser.add_argument("--skip", type=_names, default=[], help="skip these pieces")
    parser.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="side-by-side rounds (ABBA)")
    parser.add_argument("--connections", type=int, default=64, help="wrk connections, single")
    parser.add_argument(
        "--batch-connections",
        type=int,
        default=BATCH_CONNECTIONS,
        help="wrk connections, batch (default: as many decisions in flight as redis-benchmark)",
    )
    parser.add_argument("--rate", type=float, default=1000.0, help="open-loop checks/s")
    parser.add_argument(
        "--latency-rounds",
        type=_rounds,
        default=3,
        help="open-loop rounds of the trivial handler, the one-Redis baseline and the router "
        "at each rate (the figures are the rounds' medians)",
    )
    parser.add_argument(
        "--extra-rates",
        type=_rates,
        default=(3000.0,),
        help="further open-loop rates for the latency piece, e.g. 3000,5000 ('' for none)",
    )
    parser.add_argument("--memory-keys", type=int, default=100_000)
    parser.add_argument("--migration-keys", type=int, default=200_000)
    parser.add_argument("--results", type=Path, default=RESULTS, help="output directory")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the JSON document (default)")
    out.add_argument("--table", action="store_true", help="print a table of the targets")
    return parser


def _rounds(value: str) -> int:
    try:
        count = int(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"rounds are a whole number: {exc}") from exc
    if count < 1:
        raise argparse.ArgumentTypeError("at least one round")
    return count


def _version(args: list[str]) -> str | None:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stdout or done.stderr).strip().splitlines()
    return text[0] if text else None


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "load_average_at_start": list(os.getloadavg()),
        "python": platform.python_version(),
        "redis_server": _version([redis_server_binary(), "--version"]),
        "wrk": _version(["wrk", "--version"]),
    }


def missing_tools(pieces: list[str]) -> list[str]:
    from shutil import which

    needed = {tool for piece in pieces for tool in TOOLS.get(piece, [])}
    venv_bin = Path(sys.executable).parent  # py-spy comes with the bench extra
    return sorted(t for t in needed if which(t) is None and not (venv_bin / t).exists())


class Suite:
    """Runs the selected pieces; shared processes start on first use and stop at the end."""

    def __init__(self, args: argparse.Namespace, stack: contextlib.ExitStack) -> None:
        self.args = args
        self.stack = stack
        self.settings = Settings(
            seconds=args.seconds,
            rounds=args.rounds,
            single=WrkSettings(threads=1, connections=args.connections),
            batch=WrkSettings(threads=1, connections=args.batch_connections),
            rate=args.rate,
            extra_rates=args.extra_rates,
            latency_rounds=args.latency_rounds,
        )
        self._cluster: LocalCluster | None = None
        self._trivial: str | None = None

    def router(self) -> str:
        if self._cluster is None:
            note("starting a local cluster: router, 3 nodes, 3 Redis")
            self._cluster = self.stack.enter_context(scratch_cluster(3, log_level="WARNING"))
        return self._cluster.router_url

    def trivial(self) -> str:
        if self._trivial is None:
            note("starting the trivial aiohttp handler")
            self._trivial = self.stack.enter_context(trivial_server())
        return self._trivial

    def piece(self, name: str) -> Callable[[], dict[str, Any]]:
        s, a = self.settings, self.args
        return {
            "single": lambda: compare.single_check(self.router(), self.trivial(), s),
            "batch": lambda: compare.batch_vs_redis(self.router(), s),
            "sdk": lambda: compare.sdk_vs_limits(self.router(), s),
            "latency": lambda: compare.open_loop_latency(self.router(), self.trivial(), s),
            "quick": lambda: run_module_json(
                "bench.quick",
                "--router",
                self.router(),
                "--seconds",
                "5",
                "--concurrency",
                "16",
                "--batch-concurrency",
                "2",
            ),
            "profile": self.profile,
            "burst": lambda: burst(self.router()),
            "hotkey": hotkey,
            "leases": lambda: leases(max(2.0, a.seconds / 2), max(3, a.rounds)),
            "durability": lambda: durability(s),
            "grpc": lambda: run_module_json(
                "bench.grpc_cost",
                "--rate",
                "500",
                "--seconds",
                str(a.seconds),
                "--repeat",
                "3",
                timeout=1200,
            ),
            "gateway": lambda: run_module_json(
                "bench.gateway",
                "--seconds",
                str(a.seconds),
                "--rounds",
                str(a.rounds),
                timeout=1200,
            ),
            "memory": lambda: run_module_json("bench.memory", "--keys", str(a.memory_keys)),
            "rediscost": lambda: run_module_json("bench.rediscost"),
            "scaling": lambda: scaling(s),
            "migration": lambda: run_module_json(
                "bench.migration",
                "--keys",
                str(a.migration_keys),
                "--out",
                str(a.results),
                timeout=1200,
            ),
        }[name]

    def profile(self) -> dict[str, Any]:
        router = self.router()
        assert self._cluster is not None
        node_port = self._cluster.node_url(0).rsplit(":", 1)[1]
        return run_module_json(
            "bench.profile",
            "--router",
            router,
            "--data-dir",
            str(self._cluster.data_dir),
            "--node-port",
            node_port,
            "--seconds",
            str(self.args.seconds),
            "--rate",
            str(self.args.rate),
        )


def run_pieces(args: argparse.Namespace, pieces: list[str], results: dict[str, Any]) -> None:
    failed: dict[str, str] = {}
    # The shared cluster and the trivial handler live only through the pieces that use them.
    with contextlib.ExitStack() as shared:
        suite = Suite(args, shared)
        for name in [p for p in pieces if p in ON_SHARED_CLUSTER]:
            _run_one(suite, name, results, failed)
    with contextlib.ExitStack() as own:
        suite = Suite(args, own)
        for name in [p for p in pieces if p not in ON_SHARED_CLUSTER]:
            _run_one(suite, name, results, failed)
    if failed:
        results["failed"] = failed


def _run_one(suite: Suite, name: str, results: dict[str, Any], failed: dict[str, str]) -> None:
    note(f"{name}: running")
    started = time.monotonic()
    try:
        results[name] = suite.piece(name)()
    except Exception as exc:  # one broken piece must not lose the others' results
        detail = exc.stderr if isinstance(exc, subprocess.CalledProcessError) else ""
        failed[name] = f"{type(exc).__name__}: {exc} {detail}".strip()[-2000:]
        note(f"{name}: FAILED: {failed[name]}")
        traceback.print_exc(file=sys.stderr)
        return
    note(f"{name}: done in {time.monotonic() - started:.0f} s")


def cpu_windows(node: Any) -> list[dict[str, Any]]:
    """Every `cpu` block (bench.cpu.CpuWindow result) anywhere in the results."""
    if isinstance(node, list):
        return [w for item in node for w in cpu_windows(item)]
    if not isinstance(node, dict):
        return []
    found = [node["cpu"]] if isinstance(node.get("cpu"), dict) else []
    return found + [w for key, value in node.items() if key != "cpu" for w in cpu_windows(value)]


def noise(results: dict[str, Any]) -> dict[str, Any]:
    """How much of the machine other work took during the measurements (shared machine)."""
    outside = [w["outside_this_benchmark_cores"] for w in cpu_windows(results)]
    if not outside:
        return {}
    return {
        "measurements": len(outside),
        "outside_cores_mean": round(sum(outside) / len(outside), 2),
        "outside_cores_max": max(outside),
        "note": "cores busy with work outside this benchmark during its measurements "
        "(of 2); ratios are side by side, absolute numbers move with this",
    }


def write_results(results: dict[str, Any], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / "latest.json.tmp"
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    tmp.replace(directory / "latest.json")
    try:
        draw(results, directory / "latest.png")
    except Exception as exc:  # a chart problem must not lose the numbers
        note(f"chart failed: {type(exc).__name__}: {exc}")


def print_table(results: dict[str, Any], directory: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"shardlimit bench ({results['seconds']} s)")
    for column in ("target", "measured", "goal", "met"):
        table.add_column(column)
    for name, t in results["targets"].items():
        value = "-" if t["measured"] is None else f"{t['measured']:g}"
        table.add_row(name, value, t["target"], "yes" if t["met"] else "NO")
    Console().print(table)
    for name, error in results.get("failed", {}).items():
        print(f"{name} failed: {error}")
    print(f"results: {directory / 'latest.json'}, chart: {directory / 'latest.png'}")


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds every `with`: started processes are stopped


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = build_parser(prog).parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    pieces = [p for p in (args.only or PIECES) if p not in args.skip]
    missing = missing_tools(pieces)
    if missing:
        print(
            f"bench: missing {', '.join(missing)}: run `make bench-deps` "
            "(apt-get install wrk redis-tools redis-server)",
            file=sys.stderr,
        )
        return 2
    started = time.monotonic()
    results: dict[str, Any] = {
        "started": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "pieces": pieces,
        "machine": machine(),
        "settings": {
            "seconds_per_measurement": args.seconds,
            "rounds": args.rounds,
            "wrk_single": {"threads": 1, "connections": args.connections},
            "wrk_batch": {
                "threads": 1,
                "connections": args.batch_connections,
                "batch": BATCH_SIZE,
            },
            "sdk_callers": 64,
            "open_loop_rate_per_s": args.rate,
            "open_loop_extra_rates_per_s": list(args.extra_rates),
            "open_loop_rounds": args.latency_rounds,
            "keys": 100_000,
        },
    }
    note(f"pieces: {', '.join(pieces)}")
    run_pieces(args, pieces, results)
    results["targets"] = targets(results)
    results["noise"] = noise(results)
    results["seconds"] = round(time.monotonic() - started, 1)
    write_results(results, args.results)
    note(f"wrote {args.results / 'latest.json'} and latest.png in {results['seconds']} s")
    if args.table:
        print_table(results, args.results)
    else:
        print(json.dumps(results, indent=2))
    return 1 if "failed" in results else 0


if __name__ == "__main__":
    sys.exit(main())
