"""The Redis side of a local cluster: each node's Redis and, with replicas, its replica
redis-servers and the 3 Sentinels (cluster/local/sentinel_proc.py), on the ports the data
dir recorded when it was started before (cluster/local/recorded.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.local.ports import free_port, listening
from cluster.local.recorded import RecordedPorts, load_ports, redis_dir, save_ports
from cluster.local.redis_proc import RedisProcess
from cluster.local.sentinel_proc import Replication
from cluster.local.supervisor import Watched
from cluster.local.up_options import UpOptions

__all__ = ["Shards", "build_shards", "follow_recorded"]


def follow_recorded(options: UpOptions, data_dir: Path) -> tuple[RecordedPorts | None, str]:
    """How `data_dir` was started before (None: never), and bring back the replicas and
    Sentinel settings it was started with, saying so when they differ from what was
    asked (else the note is "").

    Like --nodes, --replicas describes a new cluster. On a recorded one, the count is
    part of what is brought back, as an operator restarting a cluster expects with or
    without repeating its flags: after a failover the primary role may be on a replica,
    so dropping replicas could drop the newest copy of the counters, and the Sentinels'
    own files name the replicas they know. The Sentinels keep their down-after in those
    files as well. Another count needs a new data dir."""
    recorded = load_ports(data_dir)
    if recorded is None:
        return None, ""
    asked = (options.replicas, options.down_after_ms)
    options.replicas, options.down_after_ms = recorded.replicas, recorded.down_after_ms
    if asked == (recorded.replicas, recorded.down_after_ms):
        return recorded, ""
    return recorded, (
        f"{data_dir} was started with --replicas {recorded.replicas} --down-after-ms "
        f"{recorded.down_after_ms}: bringing it back so (they apply to a new data dir)"
    )


@dataclass
class Shards:
    """Every node's Redis (`redis`: the first primaries, in node order), the --redis URL
    each node is given (`urls`), and the replicas and Sentinels (`replication`)."""

    node_ids: list[str]
    redis: list[RedisProcess]
    urls: list[str]
    replication: Replication | None

    def watched(self) -> list[Watched]:
        """Every Redis and Sentinel, for a Supervisor."""
        found = []
        for node_id, redis in zip(self.node_ids, self.redis, strict=True):
            assert redis.child is not None, "supervise a started cluster"
            if self.replication is None:
                found.append(Watched(redis.child, redis.spawn))
            else:
                found.append(self.replication.watch(node_id, redis))
        return found + (self.replication.watched() if self.replication else [])

    def summary(self, index: int) -> dict[str, Any]:
        redis = self.redis[index]
        replication = self.replication
        replicas = replication.shards[self.node_ids[index]] if replication else []
        return {
            "redis": self.urls[index],
            "redis_port": redis.port,  # the first primary (Sentinel may have promoted another)
            "redis_dir": str(redis.data_dir),
            "replicas": [r.port for r in replicas],
            "sentinels": [f"{replication.host}:{port}" for port in replication.sentinel_ports]
            if replication
            else [],
        }


def build_shards(
    options: UpOptions,
    data_dir: Path,
    node_ids: Sequence[str],
    promised: set[int],
    recorded: RecordedPorts | None,
) -> Shards:
    """Every Redis and Sentinel, not started yet; their ports recorded in the data dir
    (before anything starts: a Sentinel writes them into its own files). `promised`:
    ports others will bind; ours are added. The processes a recorded cluster had come
    back on their ports; without replicas, a Redis whose port was taken meanwhile takes
    a free one."""
    record = RecordedPorts(options.replicas, options.down_after_ms)
    replication = None
    if options.replicas:
        promised |= recorded.ports() if recorded is not None else set()
        replication = Replication(data_dir, options.replicas, promised, options.down_after_ms)
        if recorded is not None:
            replication.sentinel_ports = list(recorded.sentinels)
    shards = Shards(list(node_ids), [], [], replication)
    for node_id in node_ids:
        ports = recorded.redis.get(node_id, []) if recorded else []
        if replication is None and ports:  # a preference only: taken meanwhile, another
            ports = [p for p in ports[:1] if p not in promised and not listening(p, options.host)]
        redis = RedisProcess(
            port=ports[0] if ports else free_port(avoid=promised),
            data_dir=redis_dir(data_dir, node_id),
            appendfsync=options.appendfsync,
        )
        promised.add(redis.port)
        shards.redis.append(redis)
        if replication is None:
            shards.urls.append(redis.url)
            record.redis[node_id] = [redis.port]
            continue
        shards.urls.append(replication.add(node_id, redis, ports[1:]))
        replicas = replication.shards[node_id]
        record.redis[node_id] = [redis.port, *(r.port for r in replicas)]
    if replication is not None:
        record.sentinels = list(replication.sentinel_ports)
    save_ports(data_dir, record)
    return shards
