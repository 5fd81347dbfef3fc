"""The node's Redis clients, from its `--redis` URL: redis://, rediss:// (TLS), unix://,
or redis+sentinel:// (cluster/model/sentinel_url.py): a primary found through Redis
Sentinel. Under Sentinel every new connection asks the Sentinels for the current
primary (a primary they see down is no primary: the call fails and the node answers
503, consuming nothing) and checks its ROLE; a reply of READONLY (a demoted primary)
drops the connection; and once the primary changes (node/store/primary_watch.py follows
Sentinel's +switch-master), no command is sent on a connection to the old one.

Every Sentinel is asked, and the primary named at the highest config epoch wins; the
leader of a failover in progress is not asked (it names the old primary at the new
epoch until the failover ends), and right after a +switch-master an answer naming
another primary at no higher an epoch than before is stale. The first Sentinel to
answer, what redis-py's own discovery takes, may be either; and a demoted primary that
wakes believes itself a primary until Sentinel turns it into a replica, some seconds
later: its ROLE check passes, and whatever is written to it meanwhile is lost when it
resyncs.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.sentinel import (
    MasterNotFoundError,
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
)
from redis.exceptions import ConnectionError, RedisError

from cluster.model.sentinel_url import is_sentinel_url, parse_sentinel_url

__all__ = [
    "FollowingPool",
    "PrimaryConnection",
    "host_port",
    "linked",
    "primary_address",
    "promotable",
    "redis_client",
    "sentinel_pool",
    "sentinel_replicas",
]

SENTINEL_TIMEOUT_S = 0.25  # one Sentinel's answer
# A Sentinel that missed a promotion hears of it from another's hello (every 2 s).
SWITCH_SEEN_WITHIN_S = 10.0
FAILOVER_IN_PROGRESS = "failover_in_progress"  # a Sentinel's flag on a shard it fails over


class PrimaryConnection(SentinelManagedConnection):
    """A connection to the shard's primary that never writes to another server: its
    server must answer ROLE as a master when connected, and a connection to a server
    the pool no longer names as the primary reconnects before its next command."""

    async def connect_to(self, address: tuple[str, int]) -> None:
        await super().connect_to(address)  # type: ignore[no-untyped-call]
        await self.send_command("ROLE", check_health=False)
        role = await self.read_response()
        name = role[0] if isinstance(role, list) and role else role
        if (name.decode() if isinstance(name, bytes) else str(name)) != "master":
            await self.disconnect()
            raise ConnectionError(f"{address[0]}:{address[1]} is no longer the primary")

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        primary = self.connection_pool.master_address
        if self.is_connected and primary is not None and primary != (self.host, self.port):
            await self.disconnect()
            await self.connect()  # type: ignore[no-untyped-call]
        await super().send_packed_command(command, check_health)


class FollowingPool(SentinelConnectionPool):
    """redis-py's Sentinel pool, told of a promotion as soon as the Sentinels' leader
    has sent the chosen replica REPLICAOF NO ONE (node/store/primary_watch.py). Until
    Sentinel confirms it, which takes up to its 1 s INFO period more, the Sentinels
    still name the old primary: new connections go to `promoted` instead, and each
    checks that it answers ROLE as a master (PrimaryConnection)."""

    promoted: tuple[str, int] | None = None
    newest: tuple[int, tuple[str, int]] | None = None  # (config epoch, primary) last named
    # After a +switch-master to `address` the node has not seen named yet: until then (or
    # `until`), an answer naming another primary at an epoch not above `epoch` is stale.
    switch: tuple[tuple[str, int], int, float] | None = None

    async def get_master_address(self) -> tuple[str, int]:
        if self.promoted is not None:
            self.master_address = self.promoted
            return self.promoted
        address = await self._newest_primary()
        if self.master_address != address:
            self.master_address = address
            await self.disconnect(inuse_connections=False)  # idle ones reconnect there
        return address

    def switched(self, address: tuple[str, int]) -> None:
        """Sentinel announced `address` as the new primary (+switch-master)."""
        epoch, named = self.newest if self.newest is not None else (-1, None)
        if named != address:
            self.switch = (address, epoch, time.monotonic() + SWITCH_SEEN_WITHIN_S)

    async def _newest_primary(self) -> tuple[str, int]:
        manager = self.sentinel_manager
        answers = await asyncio.gather(
            *(sentinel.sentinel_masters() for sentinel in manager.sentinels),
            return_exceptions=True,
        )
        best: tuple[int, tuple[str, int]] | None = None
        for masters in answers:
            if isinstance(masters, (RedisError, OSError)):
                continue
            if isinstance(masters, BaseException):
                raise masters
            state = masters.get(self.service_name)
            if not state or not manager.check_master_state(state, self.service_name):
                continue
            if FAILOVER_IN_PROGRESS in _flags(state):
                continue  # the leader names the old primary until its failover ends
            epoch = int(state.get("config-epoch", 0))
            if best is None or epoch > best[0]:
                best = (epoch, (str(state["ip"]), int(state["port"])))
        if best is None:
            raise MasterNotFoundError(f"no Sentinel names a primary of {self.service_name!r}")
        epoch, address = best
        if self.switch is not None:
            announced, before, until = self.switch
            if address != announced and epoch <= before and time.monotonic() < until:
                raise MasterNotFoundError(
                    f"the Sentinels that answered have not heard of the promotion of "
                    f"{announced[0]}:{announced[1]} yet"
                )
            self.switch = None
        self.newest = best
        return address


def _flags(state: dict[str, Any]) -> set[str]:
    flags = state.get("flags", "")
    return set(flags) if isinstance(flags, (set, list)) else set(str(flags).split(","))


def redis_client(url: str, **options: Any) -> aioredis.Redis:
    """A client of the node's Redis primary; `options` are redis-py's connection ones."""
    if not is_sentinel_url(url):
        return aioredis.from_url(url, **options)
    target = parse_sentinel_url(url)
    sentinels = Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
        list(target.sentinels),
        socket_timeout=SENTINEL_TIMEOUT_S,
        socket_connect_timeout=SENTINEL_TIMEOUT_S,
    )
    client: aioredis.Redis = sentinels.master_for(
        target.master,
        db=target.db,
        username=target.username,
        password=target.password,
        connection_pool_class=FollowingPool,
        connection_class=PrimaryConnection,
        **options,
    )
    return client


def sentinel_pool(client: aioredis.Redis) -> FollowingPool | None:
    """The client's Sentinel-backed pool, or None for a client of a fixed server."""
    pool = client.connection_pool
    return pool if isinstance(pool, FollowingPool) else None


def host_port(host: Any, port: Any) -> str:
    """ "host:port" of a Redis address as redis-py or a Sentinel reply gives it."""
    return f"{host.decode() if isinstance(host, bytes) else host}:{int(port)}"


def promotable(replica: dict[str, Any]) -> bool:
    """Whether the Sentinel that lists `replica` (its SENTINEL REPLICAS entry) could
    promote it: it sees it up and has read its INFO at least once (its run id is
    known). Sentinel never promotes a replica whose INFO it has not read
    (sentinelSelectSlave). An entry it has not read yet is mostly the old primary's,
    made at the switch: while that process restarts, Sentinel's connection to it can
    be open with no answer yet, and the entry shows neither down nor disconnected for
    a second or more."""
    if replica.get("is_sdown") or replica.get("is_disconnected"):
        return False
    return bool(replica.get("runid"))


def linked(replica: dict[str, Any]) -> bool:
    """Whether its link to the primary was up when the Sentinel that lists `replica`
    last read it: a replica that is not following the stream (restarting, connecting,
    loading what a full sync sent) acknowledges nothing until it is."""
    return bool(replica.get("master-link-status", "ok") == "ok")


async def sentinel_replicas(client: aioredis.Redis) -> dict[str, bool] | None:
    """{"host:port": waited for} of every replica of the shard any Sentinel knows, less
    the primary the node writes to (it follows a promotion before the Sentinels confirm
    it); None without Sentinel, or when none answers.

    A replica is waited for when some Sentinel could promote it (a replica being
    promoted is still one until the failover ends; a Sentinel may not have discovered a
    new replica yet) and the freshest read of it among those showed its link to the
    primary up: one away from the stream has none of it since it left, and gets all of
    it once back, whatever a WAIT asks meanwhile."""
    pool = sentinel_pool(client)
    if pool is None:
        return None
    primary = host_port(*pool.master_address) if pool.master_address else None
    answers = await asyncio.gather(
        *(s.sentinel_slaves(pool.service_name) for s in pool.sentinel_manager.sentinels),
        return_exceptions=True,
    )
    known: dict[str, bool] | None = None
    read_ms_ago: dict[str, int] = {}  # the freshest read of a promotable replica
    for replicas in answers:
        if isinstance(replicas, (RedisError, OSError)):
            continue
        if isinstance(replicas, BaseException):
            raise replicas
        known = known if known is not None else {}
        for r in replicas:
            address = host_port(r["ip"], r["port"])
            known.setdefault(address, False)
            age = int(r.get("info-refresh", 0))
            if promotable(r) and (address not in read_ms_ago or age < read_ms_ago[address]):
                read_ms_ago[address] = age
                known[address] = linked(r)
    if known is not None:
        known.pop(primary or "", None)
    return known


async def primary_address(client: aioredis.Redis) -> dict[str, Any]:
    """{"host", "port", "db"} of the primary `client` writes to now (a peer's MIGRATE
    target); under Sentinel, as the Sentinels name it."""
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    if isinstance(pool, SentinelConnectionPool):
        host, port = await pool.get_master_address()  # type: ignore[no-untyped-call]
        return {"host": host, "port": int(port), "db": kwargs.get("db", 0)}
    return {"host": kwargs.get("host"), "port": kwargs.get("port"), "db": kwargs.get("db", 0)}
