"""Helpers for child processes: no orphans, readiness, finding them by command line."""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1


def child_preexec() -> None:
    """Ask Linux to SIGTERM this child when its parent dies (no orphan redis-server)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def wait_http_ok(
    url: str,
    within: float,
    proc: subprocess.Popen[Any] | None = None,
    exit_detail: Callable[[], str] = lambda: "",
) -> None:
    """Poll `url` until it answers 200; RuntimeError if `proc` exits first or time runs out."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"{proc.args!r} exited with {proc.returncode} before {url} answered{exit_detail()}"
            )
        try:
            with urllib.request.urlopen(url, timeout=1) as response:  # noqa: S310 - our own URL
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)  # polling a condition with a deadline
    raise RuntimeError(f"{url} did not answer 200 within {within:.0f} s")


def command_lines() -> Iterator[tuple[int, str]]:
    """(pid, command line) of every process we can see (Linux /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        yield int(entry.name), cmdline
