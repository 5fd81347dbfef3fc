"""Key partitioning: a consistent-hash ring and Redis-Cluster-style CRC16 slots.

Both partitioners route on the Redis hash tag of a key (see `routing_part`), expose
the same interface (`owner`, `locate`, `shares`, `resized`, `plan`, `to_dict`) and
serialise to plain JSON so the topology can be persisted and pushed to nodes.
"""

from __future__ import annotations

import abc
import binascii
import hashlib
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from uhashring import HashRing

from cluster.model.nodes import NodeSpec

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

HASH_SLOTS: int = 16384
DEFAULT_VNODES: int = 160
MAX_VNODES: int = 10000
RING_SIZE: int = 1 << 64
"""Size of the ring's hash space: points and key positions are in ``[0, RING_SIZE)``."""

_SLOT_MASK = HASH_SLOTS - 1


def routing_part(key: str) -> str:
    """Return the part of `key` that is hashed: its non-empty `{tag}`, else the whole key."""
    start = key.find("{")
    if start == -1:
        return key
    end = key.find("}", start + 1)
    if end == -1 or end == start + 1:
        return key
    return key[start + 1 : end]


def key_slot(key: str) -> int:
    """Return the Redis Cluster hash slot of `key` (same answer as ``CLUSTER KEYSLOT``)."""
    return binascii.crc_hqx(routing_part(key).encode("utf-8"), 0) & _SLOT_MASK


def ring_hash(value: str) -> int:
    """Return the 64-bit ring position of `value` (first 8 bytes of its MD5, big-endian)."""
    # uhashring's default hash is the full 128-bit MD5; 64 bits keep ring points within
    # what orjson (and any JSON consumer using int64/uint64) can carry, e.g. in /v1/locate.
    digest = hashlib.md5(value.encode("utf-8"), usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "big")


@dataclass(frozen=True)
class Move:
    """Part of the keyspace that changes owner from `source` to `target`."""

    source: str
    target: str
    fraction: float
    slots: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, object]:
        """Return a JSON-serialisable form."""
        return {
            "source": self.source,
            "target": self.target,
            "fraction": self.fraction,
            "slots": list(self.slots),
        }


def _validate_nodes(nodes: Sequence[NodeSpec]) -> tuple[NodeSpec, ...]:
    """Check membership rules and return the nodes as a tuple."""
    result = tuple(nodes)
    if not result:
        raise ValueError("a partitioner needs at least one node")
    seen: set[str] = set()
    for node in result:
        if not isinstance(node, NodeSpec):
            raise ValueError(f"expected NodeSpec, got {type(node).__name__}")
        if not isinstance(node.id, str) or not node.id:
            raise ValueError(f"node id must be a non-empty string, got {node.id!r}")
        if node.id in seen:
            raise ValueError(f"duplicate node id {node.id!r}")
        seen.add(node.id)
        weight = node.weight
        if not isinstance(weight, int) or isinstance(weight, bool) or weight < 1:
            raise ValueError(f"node {node.id!r}: weight must be a positive integer, got {weight!r}")
    return result


def _validate_vnodes(vnodes: object) -> int:
    if not isinstance(vnodes, int) or isinstance(vnodes, bool) or not 1 <= vnodes <= MAX_VNODES:
        raise ValueError(f"vnodes must be an integer between 1 and {MAX_VNODES}, got {vnodes!r}")
    return vnodes


class Partitioner(abc.ABC):
    """Maps keys to node ids; immutable once built."""

    kind: ClassVar[str]
    nodes: tuple[NodeSpec, ...]

    @property
    def node_ids(self) -> tuple[str, ...]:
        """Node ids in membership order."""
        return tuple(node.id for node in self.nodes)

    @abc.abstractmethod
    def owner(self, key: str) -> str:
        """Return the id of the node that owns `key`."""

    @abc.abstractmethod
    def locate(self, key: str) -> dict[str, str | int]:
        """Return the owner of `key` plus its position (``slot`` or ring ``point``)."""

    @abc.abstractmethod
    def shares(self) -> dict[str, float]:
        """Return the fraction of the keyspace owned by each node id (sums to 1.0)."""

    @abc.abstractmethod
    def resized(self, nodes: Sequence[NodeSpec]) -> Partitioner:
        """Return a partitioner of the same kind and parameters for a new membership."""

    @abc.abstractmethod
    def plan(self, new: Partitioner) -> list[Move]:
        """Return the moves needed to go from this layout to `new`, sorted by (source, target)."""

    @abc.abstractmethod
    def to_dict(self) -> dict[str, object]:
        """Return the full state in a JSON-serialisable form."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(nodes={list(self.node_ids)!r})"


class RingPartitioner(Partitioner):
    """Consistent-hash ring (uhashring) with `vnodes * weight` points per node."""

    kind: ClassVar[str] = "ring"

    def __init__(self, nodes: Sequence[NodeSpec], *, vnodes: int = DEFAULT_VNODES) -> None:
        self.nodes = _validate_nodes(nodes)
        self.vnodes = _validate_vnodes(vnodes)
        ring = HashRing(
            nodes={n.id: {"weight": n.weight, "vnodes": self.vnodes} for n in self.nodes},
            vnodes=self.vnodes,
            hash_fn=ring_hash,
        )
        # Lookups bisect our own copy of the continuum (~25% faster than calling
        # HashRing.get_node); uhashring's lookup is bisect_right with wrap to 0,
        # reproduced exactly in owner(). The extra owner at the end is the wrap.
        points: list[tuple[int, str]] = ring.get_points()
        self._points: list[int] = [point for point, _ in points]
        self._owners: list[str] = [name for _, name in points]
        self._owners.append(self._owners[0])

    def owner(self, key: str) -> str:
        """Return the id of the node that owns `key`."""
        return self._owners[bisect_right(self._points, ring_hash(routing_part(key)))]

    def locate(self, key: str) -> dict[str, str | int]:
        """Return ``{"node": id, "point": p}`` where p is the key's position on the ring."""
        point = ring_hash(routing_part(key))
        return {"node": self._owners[bisect_right(self._points, point)], "point": point}

    def _owner_at(self, position: int) -> str:
        return self._owners[bisect_right(self._points, position)]

    def points(self) -> list[tuple[int, str]]:
        """Return the sorted continuum as ``(point, node_id)`` pairs."""
        return list(zip(self._points, self._owners, strict=False))

    def shares(self) -> dict[str, float]:
        """Return each node's fraction of the ring (sum of the arcs ending at its points)."""
        arcs: dict[str, int] = dict.fromkeys(self.node_ids, 0)
        previous = self._points[-1] - RING_SIZE
        for point, owner in zip(self._points, self._owners, strict=False):
            arcs[owner] += point - previous
            previous = point
        return {node_id: length / RING_SIZE for node_id, length in arcs.items()}

    def resized(self, nodes: Sequence[NodeSpec]) -> RingPartitioner:
        """Return a ring with the same vnodes for a new membership."""
        return RingPartitioner(nodes, vnodes=self.vnodes)

    def plan(self, new: Partitioner) -> list[Move]:
        """Return the exact arc fractions that change owner, from merging both continua."""
        if not isinstance(new, RingPartitioner):
            raise ValueError(f"cannot plan a move from a {self.kind!r} to a {new.kind!r} layout")
        # Between two consecutive boundaries of the merged continua neither ring has a
        # point, so both owners are constant on [bound, next_bound).
        bounds = sorted(set(self._points).union(new._points))
        moved: defaultdict[tuple[str, str], int] = defaultdict(int)
        for i, bound in enumerate(bounds):
            following = bounds[i + 1] if i + 1 < len(bounds) else bounds[0] + RING_SIZE
            source, target = self._owner_at(bound), new._owner_at(bound)
            if source != target:
                moved[(source, target)] += following - bound
        return [
            Move(source=source, target=target, fraction=length / RING_SIZE)
            for (source, target), length in sorted(moved.items())
        ]

    def to_dict(self) -> dict[str, object]:
        """Return ``{"kind": "ring", "nodes": [...], "vnodes": n}``."""
        return {
            "kind": self.kind,
            "nodes": [node.to_dict() for node in self.nodes],
            "vnodes": self.vnodes,
        }


def _slot_targets(nodes: Sequence[NodeSpec], current: Mapping[str, int]) -> dict[str, int]:
    """Return the weighted slot count per node id, summing to HASH_SLOTS."""
    total_weight = sum(node.weight for node in nodes)
    targets = {node.id: HASH_SLOTS * node.weight // total_weight for node in nodes}
    remainder = HASH_SLOTS - sum(targets.values())
    # The few leftover slots go to the nodes that currently hold the most above their
    # floor (then to the first nodes): each such choice saves one slot move.
    order = sorted(
        range(len(nodes)),
        key=lambda i: targets[nodes[i].id] - current.get(nodes[i].id, 0),
    )
    for i in order[:remainder]:
        targets[nodes[i].id] += 1
    return targets


def _balanced_table(nodes: Sequence[NodeSpec]) -> list[str]:
    """Return a fresh table: contiguous ranges in node order, sized by weight."""
    targets = _slot_targets(nodes, {})
    table: list[str] = []
    for node in nodes:
        table.extend([node.id] * targets[node.id])
    return table


def _rebalanced_table(old: Sequence[str], nodes: Sequence[NodeSpec]) -> list[str]:
    """Return `old` rebalanced for `nodes`, moving as few slots as possible."""
    ids = {node.id for node in nodes}
    owned: dict[str, list[int]] = {node.id: [] for node in nodes}
    pool: list[int] = []
    for slot, owner in enumerate(old):
        if owner in ids:
            owned[owner].append(slot)
        else:
            pool.append(slot)
    current = {node_id: len(slots) for node_id, slots in owned.items()}
    targets = _slot_targets(nodes, current)
    for node in nodes:
        excess = current[node.id] - targets[node.id]
        if excess > 0:
            # Donors give away their highest slots so their first range stays intact.
            pool.extend(owned[node.id][-excess:])
    pool.sort()
    table = list(old)
    taken = 0
    for node in nodes:
        deficit = targets[node.id] - current[node.id]
        if deficit > 0:
            for slot in pool[taken : taken + deficit]:
                table[slot] = node.id
            taken += deficit
    return table


class SlotPartitioner(Partitioner):
    """Redis-Cluster-style partitioner: CRC16 of the routing part, 16384-slot table."""

    kind: ClassVar[str] = "slots"

    def __init__(self, nodes: Sequence[NodeSpec], table: Sequence[str] | None = None) -> None:
        self.nodes = _validate_nodes(nodes)
        if table is None:
            self._table = _balanced_table(self.nodes)
            return
        if len(table) != HASH_SLOTS:
            raise ValueError(f"slot table must have {HASH_SLOTS} entries, got {len(table)}")
        unknown = set(table).difference(self.node_ids)
        if unknown:
            raise ValueError(f"slot table names unknown node ids: {sorted(unknown)!r}")
        self._table = list(table)

    @property
    def table(self) -> tuple[str, ...]:
        """The slot -> node id table (index = slot)."""
        return tuple(self._table)

    def slots_of(self, node_id: str) -> list[int]:
        """Return the sorted slots owned by `node_id`."""
        return [slot for slot, owner in enumerate(self._table) if owner == node_id]

    def owner(self, key: str) -> str:
        """Return the id of the node that owns `key`."""
        return self._table[binascii.crc_hqx(routing_part(key).encode("utf-8"), 0) & _SLOT_MASK]

    def locate(self, key: str) -> dict[str, str | int]:
        """Return ``{"node": id, "slot": n}``."""
        slot = key_slot(key)
        return {"node": self._table[slot], "slot": slot}

    def shares(self) -> dict[str, float]:
        """Return each node's slot count divided by HASH_SLOTS."""
        counts = Counter(self._table)
        return {node_id: counts[node_id] / HASH_SLOTS for node_id in self.node_ids}

    def resized(self, nodes: Sequence[NodeSpec]) -> SlotPartitioner:
        """Return a minimal-move rebalance of the current table for `nodes`.

        Slots of removed nodes are redistributed, nodes above their weighted target give
        slots to nodes below it, and every other slot stays where it is (like
        ``redis-cli --cluster rebalance``). Calling it with the same nodes rebalances.
        """
        nodes = _validate_nodes(nodes)
        return SlotPartitioner(nodes, _rebalanced_table(self._table, nodes))

    def plan(self, new: Partitioner) -> list[Move]:
        """Return, per (source, target), the exact slots that change owner."""
        if not isinstance(new, SlotPartitioner):
            raise ValueError(f"cannot plan a move from a {self.kind!r} to a {new.kind!r} layout")
        moved: defaultdict[tuple[str, str], list[int]] = defaultdict(list)
        for slot, (source, target) in enumerate(zip(self._table, new._table, strict=True)):
            if source != target:
                moved[(source, target)].append(slot)
        return [
            Move(source=source, target=target, fraction=len(slots) / HASH_SLOTS, slots=tuple(slots))
            for (source, target), slots in sorted(moved.items())
        ]

    def ranges(self) -> list[tuple[int, int, str]]:
        """Return the table as contiguous ``(start, end_inclusive, node_id)`` ranges."""
        result: list[tuple[int, int, str]] = []
        start = 0
        for slot in range(1, HASH_SLOTS + 1):
            if slot == HASH_SLOTS or self._table[slot] != self._table[start]:
                result.append((start, slot - 1, self._table[start]))
                start = slot
        return result

    def to_dict(self) -> dict[str, object]:
        """Return ``{"kind": "slots", "nodes": [...], "slots": [[start, end, id], ...]}``."""
        return {
            "kind": self.kind,
            "nodes": [node.to_dict() for node in self.nodes],
            "slots": [[start, end, owner] for start, end, owner in self.ranges()],
        }


def _nodes_from_data(raw: object) -> list[NodeSpec]:
    if not isinstance(raw, list) or not raw:
        raise ValueError("'nodes' must be a non-empty list of node objects")
    nodes: list[NodeSpec] = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise ValueError(f"nodes[{i}] must be an object, got {type(item).__name__}")
        if not isinstance(item.get("id"), str):
            raise ValueError(f"nodes[{i}].id must be a string")
        if "urls" not in item and not isinstance(item.get("url"), str):
            raise ValueError(f"nodes[{i}].url must be a string")
        nodes.append(NodeSpec.from_dict(dict(item)))
    return nodes


def _table_from_ranges(raw: object, node_ids: set[str]) -> list[str]:
    if not isinstance(raw, list):
        raise ValueError("'slots' must be a list of [start, end, node_id] ranges")
    table: list[str | None] = [None] * HASH_SLOTS
    for i, entry in enumerate(raw):
        if not isinstance(entry, list | tuple) or len(entry) != 3:
            raise ValueError(f"slots[{i}] must be [start, end, node_id], got {entry!r}")
        start, end, owner = entry
        for bound in (start, end):
            if not isinstance(bound, int) or isinstance(bound, bool):
                raise ValueError(f"slots[{i}]: bounds must be integers, got {entry!r}")
        if not 0 <= start <= end < HASH_SLOTS:
            raise ValueError(
                f"slots[{i}]: need 0 <= start <= end <= {HASH_SLOTS - 1}, got {start}..{end}"
            )
        if owner not in node_ids:
            raise ValueError(f"slots[{i}]: unknown node id {owner!r}")
        for slot in range(start, end + 1):
            if table[slot] is not None:
                raise ValueError(f"slots[{i}]: slot {slot} is assigned more than once")
            table[slot] = owner
    missing = [slot for slot, owner in enumerate(table) if owner is None]
    if missing:
        raise ValueError(
            f"slot table does not cover every slot: {len(missing)} unassigned, "
            f"first is {missing[0]}"
        )
    return [owner for owner in table if owner is not None]


def partitioner_from_dict(data: Mapping[str, object]) -> Partitioner:
    """Rebuild a partitioner from `Partitioner.to_dict` output (ValueError if invalid).

    A missing ``vnodes`` means the default (160); a missing ``slots`` table means a fresh
    balanced one, so hand-written configs may leave them out.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"partitioner state must be an object, got {type(data).__name__}")
    kind = data.get("kind")
    nodes = _nodes_from_data(data.get("nodes"))
    if kind == RingPartitioner.kind:
        return RingPartitioner(nodes, vnodes=_validate_vnodes(data.get("vnodes", DEFAULT_VNODES)))
    if kind == SlotPartitioner.kind:
        raw_slots = data.get("slots")
        if raw_slots is None:
            return SlotPartitioner(nodes)
        ids = _validate_nodes(nodes)
        return SlotPartitioner(ids, _table_from_ranges(raw_slots, {n.id for n in ids}))
    raise ValueError(f"unknown partitioner kind {kind!r} (expected 'ring' or 'slots')")


def new_partitioner(
    kind: str, nodes: Sequence[NodeSpec], *, vnodes: int = DEFAULT_VNODES
) -> Partitioner:
    """Return a fresh balanced layout of `kind` ("ring" or "slots") over `nodes`."""
    if kind == RingPartitioner.kind:
        return RingPartitioner(nodes, vnodes=vnodes)
    if kind == SlotPartitioner.kind:
        _validate_vnodes(vnodes)
        return SlotPartitioner(nodes)
    raise ValueError(f"unknown partitioner kind {kind!r} (expected 'ring' or 'slots')")
