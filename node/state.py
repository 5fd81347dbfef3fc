"""A counter node's state: its Redis clients and store, topology, holds, migration and
metrics, and their start and close. The handlers are in node/edge/."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from redis.exceptions import RedisError

from cluster.model.keys import SWEEPER_LEASE_KEY
from cluster.model.sentinel_url import is_sentinel_url, parse_sentinel_url
from cluster.model.topology import Topology
from node.config import NodeConfig
from node.health.liveness import LivenessResponder
from node.health.metrics import NodeMetrics
from node.health.redis_stats import eviction_warning
from node.holds.coordinator_records import CoordinatorRecords
from node.holds.keeper import HoldKeeper
from node.holds.singleton import SingletonLease
from node.migration.migrator import Migrator
from node.migration.peer_client import PeerClient
from node.store.connect import redis_client, sentinel_pool
from node.store.counter_store import CounterStore
from node.store.primary_watch import PrimaryWatch
from node.store.replica_presence import ReplicaPresence
from node.store.scripts import read_lua
from node.topology.current import CurrentTopology
from node.topology.epoch_gate import EpochGate
from node.topology.kept import KeptTopology
from node.topology.ownership import Ownership

__all__ = ["NodeState"]

log = logging.getLogger("shardlimit.node")


class NodeState:
    """Builds the node's pieces and hands each what it uses (the current topology, the
    store, the epoch gate, the peers); the handlers reach them through it."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        node_id, redis_url, cluster_token = config.node_id, config.redis_url, config.cluster_token
        decision_ttl_ms = config.decision_ttl_ms
        self.node_id = node_id
        # The liveness port speaks what the main listener speaks (node/health/liveness.py).
        self.liveness = LivenessResponder(config.host, config.server_ssl, config.liveness_port)
        self.channel_port = (
            0  # the hot-path channel's port (node/edge/channel_server.py), once open
        )
        self.client_ssl = config.client_ssl
        self.cluster_token = cluster_token
        self.test_mode = config.test_mode
        # redis://, rediss:// (TLS: ?ssl_ca_certs=...&ssl_certfile=...), user:password@ for
        # AUTH, or redis+sentinel:// (node/store/connect.py). Over TLS or Sentinel the store
        # keeps redis-py's pipeline (node/store/resp.py).
        self.redis = redis_client(
            redis_url, socket_connect_timeout=0.25, socket_timeout=1.0, max_connections=64
        )
        # Counter scripts get a client of their own WITHOUT a read timeout: a reply is
        # read however late it comes. A read timeout would answer "unavailable" for a
        # batch that Redis did apply (the node was only stopped while waiting, and its
        # clock jumped on SIGCONT); read late, the batch is taken back by the deadline
        # rule instead. A stopped Redis applies nothing past the deadline either
        # (batch.lua checks), and a dead one breaks the connection.
        # Its pool grows under a burst: a connect may queue behind a saturated machine
        # (a dead Redis refuses at once; the timeout is only for an unreachable host).
        self.counters = redis_client(
            redis_url, socket_connect_timeout=2.0, socket_timeout=None, max_connections=64
        )
        self.store = CounterStore(self.counters)
        self.store.replicated = is_sentinel_url(redis_url)
        self.failovers = 0  # promotions of the shard's primary followed since the start
        self.replicas = ReplicaPresence(self.redis)
        self.primary_watch: PrimaryWatch | None = None
        if self.store.replicated:
            pools = [sentinel_pool(self.redis), sentinel_pool(self.counters)]
            self.primary_watch = PrimaryWatch(
                parse_sentinel_url(redis_url),
                [pool for pool in pools if pool is not None],
                self._followed,
            )
        if decision_ttl_ms is not None:
            self.store.decision_ttl_ms = decision_ttl_ms
        self.current = CurrentTopology(node_id)
        # Batches, hold settles and copy-step moves in flight per topology epoch: a new
        # epoch is acknowledged only once every one begun under an older one reached Redis.
        self.gate = EpochGate()
        self.kept = KeptTopology(self.current, self.redis, self.gate)
        self._session: aiohttp.ClientSession | None = None
        self.peers = PeerClient(self.session, cluster_token)  # the other nodes
        # The copy's SCAN and MIGRATE calls may take longer than a read timeout.
        self.migrator = Migrator(self.counters, self.peers)
        self.records = CoordinatorRecords(self.current, self.store, self.peers)
        # All-or-nothing holds: swept, settled where their key lives (node/holds/keeper.py).
        self.holds = HoldKeeper(
            self.current,
            self.store,
            self.migrator,
            self.peers,
            self.gate,
            self.records,
            self.kept.follow_shard,
        )
        # One endpoint of the shard sweeps its holds at a time.
        self.sweeper_lease = SingletonLease(self.redis, SWEEPER_LEASE_KEY)
        self.lease_script = self.redis.register_script(read_lua("lease.lua"))
        self.rules_script = self.redis.register_script(read_lua("rules.lua"))
        self.sweeper: asyncio.Task[None] | None = None
        self.expired_batches = 0  # batches answered `expired` (late in, or late out)
        self.undone_checks = 0  # checks taken back because their answer was late
        self.metrics = NodeMetrics(node_id, self.redis, self)
        self.store.on_redis_call = self.metrics.redis_call_seconds.observe

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self.client_ssl or True)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    @property
    def ownership(self) -> Ownership | None:
        return self.current.ownership

    @property
    def topology(self) -> Topology | None:
        return self.current.topology

    @topology.setter
    def topology(self, value: Topology | None) -> None:
        self.current.adopt(value)

    @property
    def epoch(self) -> int:
        return self.current.epoch

    @property
    def pull_reads(self) -> dict[str, int]:
        return self.migrator.sources.reads

    def _followed(self, primary: tuple[str, int]) -> None:
        self.failovers += 1
        self.metrics.failovers.inc()
        self.replicas.promoted()

    async def start(self) -> None:
        if self.primary_watch is None:
            log.warning(
                "the node's Redis has no replicas (not a redis+sentinel:// URL): losing it "
                "loses its counters, and `durability: replica` rules are served as primary"
            )
        else:
            self.primary_watch.start()
            self.replicas.start()
        try:
            await self.store.measure_skew()
            evicting = await eviction_warning(self.store.client)
        except (RedisError, OSError):
            log.warning("redis not reachable at start-up; clock skew assumed 0")
        else:
            if evicting is not None:
                log.error(evicting)
        await self.kept.load_persisted()
        self.sweeper = asyncio.get_running_loop().create_task(
            self.sweeper_lease.run(self.holds.run_forever)
        )
        self.liveness.start()

    async def close(self) -> None:
        if self.sweeper is not None:
            self.sweeper.cancel()
            await asyncio.wait({self.sweeper}, timeout=5.0)
            await self.sweeper_lease.release()
        if self.primary_watch is not None:
            await self.primary_watch.close()
        await self.replicas.close()
        await self.liveness.close()
        if self._session is not None:
            await self._session.close()
        await self.redis.aclose()
        await self.counters.aclose()
        await self.store.close()
        await self.migrator.close()
