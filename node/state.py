"""A counter node's state: its Redis clients and store, topology, holds, migration and
metrics, and their start and close. The handlers are in node/app.py."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter

import aiohttp
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from cluster import wire
from cluster.model.topology import Topology
from node.config import NodeConfig
from node.errors import PeerError
from node.health.liveness import LivenessResponder
from node.health.metrics import NodeMetrics
from node.holds.coordinator_records import where_decided
from node.holds.keeper import HoldKeeper
from node.migration.migrator import Migrator
from node.store.counter_store import CounterStore
from node.store.scripts import read_lua
from node.topology.kept import load_persisted
from node.topology.ownership import Ownership

__all__ = ["NodeState"]

log = logging.getLogger("shardlimit.node")


class NodeState:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        node_id, redis_url, cluster_token = config.node_id, config.redis_url, config.cluster_token
        decision_ttl_ms = config.decision_ttl_ms
        self.node_id = node_id
        # The liveness port speaks what the main listener speaks (node/health/liveness.py).
        self.liveness = LivenessResponder(config.host, config.server_ssl)
        self.channel_port = (
            0  # the hot-path channel's port (node/edge/channel_server.py), once open
        )
        self.client_ssl = config.client_ssl
        self.cluster_token = cluster_token
        self.test_mode = config.test_mode
        # redis://, or rediss:// (TLS: ?ssl_ca_certs=...&ssl_certfile=...), user:password@
        # for AUTH. Over TLS the store keeps redis-py's pipeline (node/store/resp.py).
        self.redis = aioredis.from_url(
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
        self.counters = aioredis.from_url(
            redis_url, socket_connect_timeout=2.0, socket_timeout=None, max_connections=64
        )
        self.store = CounterStore(self.counters)
        if decision_ttl_ms is not None:
            self.store.decision_ttl_ms = decision_ttl_ms
        # All-or-nothing holds: swept, settled where their key lives (node/holds/keeper.py).
        self.holds = HoldKeeper(self, functools.partial(_resolve, self))
        self.ownership: Ownership | None = None
        # node/topology/kept.py: one install at a time; the kept topology read once.
        self.topology_lock = asyncio.Lock()
        self.topology_loaded = False
        self._session: aiohttp.ClientSession | None = None
        # The copy's SCAN and MIGRATE calls may take longer than a read timeout.
        self.migrator = Migrator(self.counters, self.session, cluster_token)
        self.lease_script = self.redis.register_script(read_lua("lease.lua"))
        self.rules_script = self.redis.register_script(read_lua("rules.lua"))
        self.sweeper: asyncio.Task[None] | None = None
        # Batches in flight per topology epoch: a new epoch is acknowledged only
        # once every batch validated against an older one has reached Redis.
        self.inflight: Counter[int] = Counter()
        self.drained = asyncio.Condition()
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
    def topology(self) -> Topology | None:
        return self.ownership.topology if self.ownership else None

    @topology.setter
    def topology(self, value: Topology | None) -> None:
        self.ownership = Ownership.build(self.node_id, value) if value is not None else None

    @property
    def epoch(self) -> int:
        return self.ownership.epoch if self.ownership else 0

    async def wait_drained(self, below_epoch: int) -> None:
        async with self.drained:
            await self.drained.wait_for(
                lambda: not any(n for e, n in self.inflight.items() if e < below_epoch)
            )

    async def start(self) -> None:
        try:
            await self.store.measure_skew()
        except (RedisError, OSError):
            log.warning("redis not reachable at start-up; clock skew assumed 0")
        await load_persisted(self)
        self.sweeper = asyncio.get_running_loop().create_task(self.holds.run_forever())
        self.liveness.start()

    async def close(self) -> None:
        if self.sweeper is not None:
            self.sweeper.cancel()
        await self.liveness.close()
        if self._session is not None:
            await self._session.close()
        await self.redis.aclose()
        await self.counters.aclose()
        await self.store.close()
        await self.migrator.close()


async def _resolve(state: NodeState, batch: str, coordinator: str) -> str | None:
    """A held batch's fate, asking its coordinator to record "abort" if undecided."""
    where = where_decided(state, coordinator)
    if where == state.node_id:
        decided = await state.store.decide(batch, "abort")
        return None if decided == "fenced" else decided  # ask the successor, later
    spec = state.ownership.node_spec(where) if state.ownership and where else None
    if spec is None:
        log.warning("batch %s: coordinator %s is not in the topology; aborting", batch, coordinator)
        return "abort"
    try:
        body = await state.migrator.post(
            spec.url + wire.DECISION_PATH, {"batch": batch, "decision": "abort"}, timeout_s=1.0
        )
    except PeerError:
        return None
    decision = body.get("decision") if isinstance(body, dict) else None
    return decision if decision in ("commit", "abort") else None
