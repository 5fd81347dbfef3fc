"""The one interface both partitioners implement, the moves a change of layout makes, and
the membership rules they share."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from cluster.model.nodes import NodeSpec

DEFAULT_VNODES: int = 160
MAX_VNODES: int = 10000


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


def validate_nodes(nodes: Sequence[NodeSpec]) -> tuple[NodeSpec, ...]:
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


def validate_vnodes(vnodes: object) -> int:
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
