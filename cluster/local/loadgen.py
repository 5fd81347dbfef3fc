"""A closed-loop HTTP load generator that runs in its own process.

Why it exists: tests and benchmarks must drive the router from a *separate* process. Load
made by threads or tasks inside pytest (or inside a benchmark driver) shares the GIL and
the event loop with the thing that judges the answers, and on a 2-core machine that skews
both the load and the verdict. The aiohttp client is too heavy for the job, so this is a
lean asyncio HTTP/1.1 keep-alive client (raw Protocols, uvloop when importable, every
request body encoded once) that counts every answer exactly and prints one JSON summary.

    python -m cluster.local.loadgen --url http://127.0.0.1:8080/v1/check --connections 128 \\
        --requests 3000 --body '{"key":"k:{i}","limits":[...]}' --keys 100 --per-key

Closed loop: each of the C connections sends its next request as soon as the previous
answer arrives, until N requests were sent (or the duration elapsed). A connection error or
a timeout is counted and the connection is reopened; the run goes on. Callers in other
processes use `run_loadgen` (asyncio, never blocks the caller's loop) or `run_loadgen_sync`.

This module is the command and the way other processes run it; the requests and the
connection are in cluster/local/load_http.py, the count in cluster/local/load_tally.py,
the run in cluster/local/load_run.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Required, TypedDict, Unpack, cast

import orjson

from cluster.local.load_http import LoadConfig
from cluster.local.load_run import LoadRun
from cluster.local.procs import child_preexec

_ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- command line


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected 'Name: value', got {text!r}")
    return name.strip(), value.strip()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m cluster.local.loadgen",
        description="closed-loop HTTP/1.1 POST load, JSON out",
    )
    parser.add_argument("--url", required=True, help="e.g. http://127.0.0.1:8080/v1/check")
    parser.add_argument("--connections", type=int, default=128)
    amount = parser.add_mutually_exclusive_group(required=True)
    amount.add_argument("--requests", type=int, help="send this many requests in total")
    amount.add_argument("--duration", type=float, help="send for this many seconds")
    bodies = parser.add_mutually_exclusive_group(required=True)
    bodies.add_argument("--body", help="JSON body; {i} = request number mod K")
    bodies.add_argument("--bodies-file", help="one JSON body per line, sent round robin")
    parser.add_argument("--keys", type=int, default=1, help="K distinct bodies (default 1)")
    parser.add_argument("--per-key", action="store_true", help="report allowed_by_key")
    parser.add_argument("--header", type=_header, action="append", default=[])
    parser.add_argument("--timeout", type=float, default=30.0, help="per request, seconds")
    return parser


def _config(args: argparse.Namespace) -> LoadConfig:
    if args.connections < 1 or args.keys < 1 or args.timeout <= 0:
        raise SystemExit("--connections and --keys must be >= 1, --timeout > 0")
    return LoadConfig(
        url=args.url,
        connections=args.connections,
        body=args.body or "",
        bodies=_read_bodies(args.bodies_file),
        requests=args.requests,
        duration_s=args.duration,
        keys=args.keys,
        per_key=args.per_key,
        headers=dict(args.header),
        timeout_s=args.timeout,
    )


def _read_bodies(path: str | None) -> tuple[str, ...]:
    if path is None:
        return ()
    bodies = tuple(line for line in Path(path).read_text().splitlines() if line.strip())
    if not bodies:
        raise SystemExit(f"--bodies-file {path}: no bodies")
    return bodies


def _raise_fd_limit(wanted: int) -> None:
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            top = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (top, hard))


def _event_loop_runner() -> Callable[[Any], Any]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return cast(Callable[[Any], Any], uvloop.run)


def main(argv: list[str] | None = None) -> int:
    config = _config(build_parser().parse_args(argv))
    _raise_fd_limit(config.connections + 64)
    result = _event_loop_runner()(LoadRun(config).run())
    _write_all(sys.stdout.fileno(), orjson.dumps(result) + b"\n")
    return 0


def _write_all(fd: int, data: bytes) -> None:
    """All of it, even to a pipe the event loop left non-blocking (a report of a few
    hundred KiB was cut at 128 KiB when written through sys.stdout)."""
    os.set_blocking(fd, True)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# ---------------------------------------------------------------- callers in other processes


class LoadOptions(TypedDict, total=False):
    """What a caller in another process says about one loadgen run (its command line)."""

    connections: Required[int]
    body: Required[str]
    requests: int | None
    duration_s: float | None
    keys: int
    per_key: bool
    headers: dict[str, str] | None
    timeout_s: float
    bodies_file: str | None  # one body per line, sent round robin, instead of `body`


def loadgen_args(url: str, **options: Unpack[LoadOptions]) -> list[str]:
    """The command line of one loadgen child process."""
    requests, duration_s = options.get("requests"), options.get("duration_s")
    if (requests is None) == (duration_s is None):
        raise ValueError("give exactly one of requests and duration_s")
    args = [
        sys.executable,
        "-m",
        "cluster.local.loadgen",
        "--url",
        url,
        "--connections",
        str(options["connections"]),
        "--keys",
        str(options.get("keys", 1)),
        "--timeout",
        str(options.get("timeout_s", 30.0)),
    ]
    bodies_file = options.get("bodies_file")
    args += ["--bodies-file", bodies_file] if bodies_file else ["--body", options["body"]]
    args += (
        ["--requests", str(requests)] if requests is not None else ["--duration", str(duration_s)]
    )
    args += ["--per-key"] if options.get("per_key") else []
    for name, value in (options.get("headers") or {}).items():
        args += ["--header", f"{name}: {value}"]
    return args


def _child_env() -> dict[str, str]:
    """This checkout first on sys.path, so the child runs this very loadgen."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH")) if p)
    return env


def _parse(returncode: int | None, stdout: bytes, stderr: bytes) -> dict[str, Any]:
    if returncode != 0:
        raise RuntimeError(f"loadgen exited with {returncode}: {stderr.decode(errors='replace')}")
    try:
        result: dict[str, Any] = orjson.loads(stdout)
    except orjson.JSONDecodeError as exc:
        text = (stdout[-500:] + b"\n" + stderr).decode(errors="replace")
        raise RuntimeError(f"loadgen printed no JSON ({exc}): {text}") from exc
    return result


async def _spawn(args: list[str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_child_env(),
        preexec_fn=child_preexec,
    )


async def run_loadgen(url: str, **options: Unpack[LoadOptions]) -> dict[str, Any]:
    """Run the load generator in a child process without blocking the caller's event loop."""
    proc = await _spawn(loadgen_args(url, **options))
    try:
        stdout, stderr = await proc.communicate()
    except BaseException:  # cancelled (e.g. a test timeout): leave no child behind
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    return _parse(proc.returncode, stdout, stderr)


class LoadProcess:
    """A loadgen child that runs until stopped (load for as long as a scenario lasts)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def stop(self) -> dict[str, Any]:
        """SIGTERM: it sends nothing more, waits for the answers in flight, reports."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        stdout, stderr = await self.proc.communicate()
        return _parse(self.proc.returncode, stdout, stderr)

    async def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        await self.proc.wait()


async def start_loadgen(url: str, **options: Unpack[LoadOptions]) -> LoadProcess:
    """Start a loadgen child that sends until `stop()` (at most a day)."""
    options = {**options, "requests": None, "duration_s": 86_400.0}
    return LoadProcess(await _spawn(loadgen_args(url, **options)))


def run_loadgen_sync(url: str, **options: Unpack[LoadOptions]) -> dict[str, Any]:
    """The blocking twin of `run_loadgen` (for benchmark drivers)."""
    done = subprocess.run(
        loadgen_args(url, **options),
        capture_output=True,
        env=_child_env(),
        preexec_fn=child_preexec,
        check=False,
    )
    return _parse(done.returncode, done.stdout, done.stderr)


if __name__ == "__main__":
    sys.exit(main())
