"""A node's Prometheus metrics (prometheus-client), in a registry of its own, served on
`GET /metrics` without a token (like `/healthz`): a scraper needs no cluster secret, and
no label carries a limit key.

Every series has a `node` label (the node id), so a dashboard can join node-side and
router-side series per node. The key count is read from Redis when scraped (DBSIZE: one
round trip per scrape, never per request).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from cluster.model.keys import LEASES_EXPIRED_KEY, NODE_SINGLETONS
from cluster.web.metrics import Families
from node.health.lease_census import LeaseCensus
from node.health.replication import replication_status

__all__ = ["NodeMetrics", "held_keys"]


# Seconds: one pipeline of script calls usually takes tens to hundreds of microseconds.
REDIS_CALL_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip
BATCH_OPS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class NodeCounts(Protocol):
    """What the node keeps as plain state and the metrics read when scraped."""

    @property
    def epoch(self) -> int: ...

    @property
    def expired_batches(self) -> int: ...

    @property
    def undone_checks(self) -> int: ...

    @property
    def failovers(self) -> int: ...

    @property
    def pull_reads(self) -> Mapping[str, int]: ...


async def held_keys(client: aioredis.Redis) -> int:
    """Keys the node holds for limits: DBSIZE less the node's own keys there
    (NODE_SINGLETONS: the rules document, the kept topology and epoch fence, ...)."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.dbsize()
        pipe.exists(*NODE_SINGLETONS)
        size, singletons = await pipe.execute()
    return int(size) - int(singletons)


class NodeMetrics:
    def __init__(self, node_id: str, client: aioredis.Redis, counts: NodeCounts) -> None:
        self.registry = registry = CollectorRegistry()
        self.client = client
        node = [node_id]
        families = Families(registry)
        self.redis_call_seconds = families.histogram(
            "shardlimit_node_redis_call_duration_seconds",
            "One pipeline of counter-script calls (EVALSHA) to the node's Redis: a batch's "
            "checks, refunds and commits, or the undo of a late batch.",
            REDIS_CALL_BUCKETS,
            "node",
        )(node_id)
        self.batch_ops = families.histogram(
            "shardlimit_node_received_batch_ops",
            "Ops per batch request the node received.",
            BATCH_OPS_BUCKETS,
            "node",
        )(node_id)
        migrated = families.counter(
            "shardlimit_node_migrated_keys_total",
            "Keys moved by migrations: `copied` this node handed over in the background "
            "copy, `pulled` it imported on first touch.",
            "node",
            "kind",
        )
        self.replica_timeouts = families.counter(
            "shardlimit_node_replica_wait_timeouts_total",
            "Batches with `durability: replica` checks that no replica acknowledged in "
            "time (WAIT): taken back and answered degraded.",
            "node",
        )(node_id)
        self.failovers = families.counter(
            "shardlimit_node_failovers_total",
            "Promotions of the shard's Redis primary (Sentinel's +switch-master) the node "
            "followed.",
            "node",
        )(node_id)
        self.unreplicated = families.counter(
            "shardlimit_node_unreplicated_checks_total",
            "`durability: replica` checks answered degraded because no replica held them in "
            "time (taken back) or none was live (not run): consuming nothing.",
            "node",
        )(node_id)
        self.redis_is_primary = Gauge(
            "shardlimit_node_redis_is_primary",
            "1 if the Redis the node writes to answers ROLE master, read at scrape time.",
            ["node"],
            registry=registry,
        ).labels(*node)
        self.replicas_up = Gauge(
            "shardlimit_node_redis_replicas_up",
            "Replicas of the shard's primary that are connected and online.",
            ["node"],
            registry=registry,
        ).labels(*node)
        self.replica_lag = Gauge(
            "shardlimit_node_redis_replica_lag_seconds",
            "The largest time since a connected replica acknowledged the replication "
            "stream (Redis counts whole seconds).",
            ["node"],
            registry=registry,
        ).labels(*node)
        self.keys_copied = migrated(node_id, "copied")
        self.keys_pulled = migrated(node_id, "pulled")
        self.keys = Gauge(
            "shardlimit_node_keys",
            "Keys the node's Redis holds for limits (DBSIZE less the node's own sl| keys), "
            "read at scrape time.",
            ["node"],
            registry=registry,
        ).labels(*node)
        self.redis_up = Gauge(
            "shardlimit_node_redis_up",
            "1 if the node's Redis answered the scrape's key count.",
            ["node"],
            registry=registry,
        ).labels(*node)
        self.lease_expirations = _RedisCount(
            "shardlimit_node_lease_expirations",
            "Leases of concurrency limits that expired unrenewed, as this node's Redis "
            "pruned them (counted there, read at scrape time).",
            node_id,
        )
        registry.register(self.lease_expirations)
        self.leases = LeaseCensus(client)
        registry.register(_LeasesHeld(node_id, self.leases))
        registry.register(_CountsCollector(node_id, counts))
        self.counts = counts

    async def render(self) -> bytes:
        """The exposition, with the key count read now (kept as it was if Redis fails)."""
        try:
            self.keys.set(await held_keys(self.client))
            self.lease_expirations.value = int(await self.client.get(LEASES_EXPIRED_KEY) or 0)
            await self.leases.advance()
            replication = await replication_status(self.client, self.counts.failovers)
        except (RedisError, OSError):
            self.redis_up.set(0)
        else:
            self.redis_up.set(1)
            self.redis_is_primary.set(replication["role"] == "master")
            replicas = replication["replicas"]
            self.replicas_up.set(sum(1 for r in replicas if r["up"]))
            lags = [r["lag_ms"] for r in replicas if r["up"] and r["lag_ms"] is not None]
            self.replica_lag.set(max(lags, default=0) / 1000)
        return generate_latest(self.registry)


class _RedisCount(Collector):
    """A counter kept in the node's Redis (it survives the node and follows a failover),
    exposed as last read."""

    def __init__(self, name: str, documentation: str, node_id: str) -> None:
        self.name, self.documentation, self.node_id = name, documentation, node_id
        self.value = 0

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=["node"])
        family.add_metric([self.node_id], self.value)
        return iter((family,))


class _LeasesHeld(Collector):
    def __init__(self, node_id: str, census: LeaseCensus) -> None:
        self.node_id = node_id
        self.census = census

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "shardlimit_node_leases_held",
            "Leases of each rule's concurrency limit held on this node, sampled: from "
            "the last complete SCAN pass over its keys (up to 10,000 keys per scrape).",
            labels=["node", "rule"],
        )
        for rule, held in sorted(self.census.held.items()):
            family.add_metric([self.node_id, rule], held)
        return iter((family,))


class _CountsCollector(Collector):
    def __init__(self, node_id: str, counts: NodeCounts) -> None:
        self.node_id = node_id
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        counts, node = self.counts, [self.node_id]
        epoch = GaugeMetricFamily(
            "shardlimit_node_topology_epoch",
            "The topology epoch the node serves.",
            labels=["node"],
        )
        epoch.add_metric(node, counts.epoch)
        expired = CounterMetricFamily(
            "shardlimit_node_expired_batches",
            "Batches answered `expired`: they came in, or finished, past their deadline.",
            labels=["node"],
        )
        expired.add_metric(node, counts.expired_batches)
        undone = CounterMetricFamily(
            "shardlimit_node_undone_checks",
            "Checks taken back because their batch finished past its deadline.",
            labels=["node"],
        )
        undone.add_metric(node, counts.undone_checks)
        reads = CounterMetricFamily(
            "shardlimit_node_pull_reads",
            "First touches during a migration by where the moving keys were read: `node` "
            "through the source node's export endpoint, `redis` from the source's Redis "
            "directly (once the source answered an export of that migration).",
            labels=["node", "source"],
        )
        for source, count in sorted(counts.pull_reads.items()):
            reads.add_metric([self.node_id, source], count)
        return iter((epoch, expired, undone, reads))
