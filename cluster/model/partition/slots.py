"""Redis-Cluster-style slots: a 16,384-entry slot table, balanced by weight and changed
with as few slot moves as possible."""

from __future__ import annotations

import binascii
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import ClassVar

from cluster.model.nodes import NodeSpec
from cluster.model.partition.hashing import HASH_SLOTS, SLOT_MASK, key_slot, routing_part
from cluster.model.partition.interface import Move, Partitioner, validate_nodes


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
        self.nodes = validate_nodes(nodes)
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
        return self._table[binascii.crc_hqx(routing_part(key).encode("utf-8"), 0) & SLOT_MASK]

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
        nodes = validate_nodes(nodes)
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
