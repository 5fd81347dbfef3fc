"""The topology this node serves now: read by every piece that places keys, set only where
a topology is adopted (node/topology/kept.py) or dropped."""

from __future__ import annotations

from cluster.model.topology import Topology
from node.topology.ownership import Ownership

__all__ = ["CurrentTopology"]


class CurrentTopology:
    __slots__ = ("node_id", "ownership")

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.ownership: Ownership | None = None  # None: no topology yet, it owns nothing

    @property
    def topology(self) -> Topology | None:
        return self.ownership.topology if self.ownership else None

    @property
    def epoch(self) -> int:
        return self.ownership.epoch if self.ownership else 0

    def adopt(self, topology: Topology | None) -> None:
        self.ownership = Ownership.build(self.node_id, topology) if topology is not None else None
