"""`shardlimit up` as a child process for a test: its console lines collected as they
come (stdout and stderr), waited for by polling, and Ctrl-C (SIGINT) at the end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

from cluster.local.ports import free_port, free_port_run

READY = "Ctrl-C stops everything."


def up_ports(nodes: int) -> list[str]:
    """`--port P --base-port B --nodes N` on free ports."""
    base = free_port_run(nodes)
    port = free_port(avoid=range(base, base + nodes))
    return ["--port", str(port), "--base-port", str(base), "--nodes", str(nodes)]


class UpProcess:
    """`python -m cluster.cli up ARGS`, its lines in `lines` (stdout and stderr alike)."""

    def __init__(self, args: Sequence[str], env: dict[str, str] | None = None) -> None:
        merged = dict(os.environ, SHARDLIMIT_ADMIN_TOKEN="admin-of-the-test")
        merged.pop("SHARDLIMIT_CLUSTER_TOKEN", None)
        merged.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cluster.cli", "up", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=merged,
            cwd=Path(__file__).resolve().parents[2],
        )
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._readers = [
            threading.Thread(target=self._read, args=(stream,), daemon=True)
            for stream in (self.proc.stdout, self.proc.stderr)
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def seen(self) -> list[str]:
        with self._lock:
            return list(self.lines)

    def wait_for(self, wanted: Callable[[str], bool], within: float = 60.0) -> str:
        """The first line `wanted` accepts, polled for until `within` seconds have passed
        (or the process exited without saying it)."""
        give_up = time.monotonic() + within
        while time.monotonic() < give_up:
            found = [line for line in self.seen() if wanted(line)]
            if found:
                return found[0]
            if self.proc.poll() is not None:
                for reader in self._readers:
                    reader.join(5)
                found = [line for line in self.seen() if wanted(line)]
                if found:
                    return found[0]
                break
            time.sleep(0.05)  # polling cadence
        raise AssertionError(f"no such line within {within} s; the console said: {self.seen()}")

    def wait_ready(self, within: float = 90.0) -> None:
        self.wait_for(lambda line: line.endswith(READY), within)

    def exit_code(self, within: float = 60.0) -> int:
        code = self.proc.wait(within)
        for reader in self._readers:
            reader.join(5)
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for reader in self._readers:
            reader.join(5)

    def __enter__(self) -> UpProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
