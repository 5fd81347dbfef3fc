"""Child processes of the benchmarks: started on free ports, always stopped.

Every process a benchmark starts goes through `running()`, a context manager that
SIGTERMs it (then SIGKILLs it after a grace period) on the way out, also on error.
Children also get PR_SET_PDEATHSIG, so they die with the benchmark process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from cluster.procs import child_preexec, wait_http_ok

ROOT = Path(__file__).resolve().parent.parent


def python_env(**extra: str) -> dict[str, str]:
    """The environment for `python -m ...` children: quiet logs, the checkout on sys.path."""
    env = dict(os.environ, SHARDLIMIT_LOG_LEVEL="WARNING", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def require_tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed: run `make bench-deps` (apt-get install)")
    return found


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port_range(count: int, low: int = 20_000, high: int = 30_000) -> int:
    """First port of `count` consecutive free ports (for `shardlimit up --base-port`)."""
    bases = list(range(low, high - count, count + 3))
    start = os.getpid() % len(bases)
    for base in bases[start:] + bases[:start]:
        if all(port_is_free(base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports in {low}..{high}")


def stop(proc: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """SIGTERM, wait up to `grace` seconds, then SIGKILL."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()


@contextlib.contextmanager
def running(
    args: list[str],
    *,
    log: Path | None = None,
    stdout: int | IO[bytes] | None = None,
    env: dict[str, str] | None = None,
    grace: float = 30.0,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start `args`; stop it (SIGTERM, then SIGKILL) when the block ends, also on error."""
    handle = log.open("ab") if log is not None else None
    try:
        proc = subprocess.Popen(
            args,
            stdout=stdout if stdout is not None else (handle or subprocess.DEVNULL),
            stderr=handle or subprocess.DEVNULL,
            env=env,
            preexec_fn=child_preexec,
        )
        try:
            yield proc
        finally:
            stop(proc, grace)
    finally:
        if handle is not None:
            handle.close()


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def wait_http(url: str, proc: subprocess.Popen[bytes] | None = None, within: float = 30.0) -> None:
    """Poll `url` until it answers 200 (or the process dies, or `within` s pass)."""
    wait_http_ok(url, within, proc)
