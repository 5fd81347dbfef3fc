"""Key partitioning: a consistent-hash ring and Redis-Cluster-style CRC16 slots.

Both partitioners route on the Redis hash tag of a key (see `routing_part`), expose
the same interface (`owner`, `locate`, `shares`, `resized`, `plan`, `to_dict`) and
serialise to plain JSON so the topology can be persisted and pushed to nodes.
"""

from __future__ import annotations

from cluster.model.partition.build import new_partitioner, partitioner_from_dict
from cluster.model.partition.hashing import (
    HASH_SLOTS,
    RING_SIZE,
    key_slot,
    ring_hash,
    routing_part,
)
from cluster.model.partition.interface import DEFAULT_VNODES, MAX_VNODES, Move, Partitioner
from cluster.model.partition.ring import RingPartitioner
from cluster.model.partition.slots import SlotPartitioner

__all__ = [
    "DEFAULT_VNODES",
    "HASH_SLOTS",
    "MAX_VNODES",
    "RING_SIZE",
    "Move",
    "Partitioner",
    "RingPartitioner",
    "SlotPartitioner",
    "key_slot",
    "new_partitioner",
    "partitioner_from_dict",
    "ring_hash",
    "routing_part",
]
