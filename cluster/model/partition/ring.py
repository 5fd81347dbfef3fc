"""The consistent-hash ring: uhashring's continuum, looked up here by bisection."""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Sequence
from typing import ClassVar

from uhashring import HashRing

from cluster.model.nodes import NodeSpec
from cluster.model.partition.hashing import RING_SIZE, ring_hash, routing_part
from cluster.model.partition.interface import (
    DEFAULT_VNODES,
    Move,
    Partitioner,
    validate_nodes,
    validate_vnodes,
)


class RingPartitioner(Partitioner):
    """Consistent-hash ring (uhashring) with `vnodes * weight` points per node."""

    kind: ClassVar[str] = "ring"

    def __init__(self, nodes: Sequence[NodeSpec], *, vnodes: int = DEFAULT_VNODES) -> None:
        self.nodes = validate_nodes(nodes)
        self.vnodes = validate_vnodes(vnodes)
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
