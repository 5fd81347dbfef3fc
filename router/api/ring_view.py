"""The layout behind `GET /v1/cluster/ring` (drawn by the /ui page): ring points or slot ranges.

Computed from the partitioner once per topology epoch and kept as encoded JSON, so serving
it costs a dictionary lookup and never touches the check path.
"""

from __future__ import annotations

from typing import Any

import orjson

from cluster.model.partition import RING_SIZE, Partitioner, RingPartitioner, SlotPartitioner
from cluster.model.topology import Topology

__all__ = ["POSITION_DIGITS", "RingView", "layout"]

POSITION_DIGITS = 6
"""Ring positions are fractions of the ring in [0, 1), floored to this many decimals."""

_SCALE: int = 10**POSITION_DIGITS


def _position(point: int) -> float:
    """`point` as a fraction of the ring, floored (so never 1.0)."""
    return (point * _SCALE // RING_SIZE) / _SCALE


def _ring_nodes(part: RingPartitioner) -> list[dict[str, Any]]:
    points: dict[str, list[float]] = {node_id: [] for node_id in part.node_ids}
    for point, owner in part.points():
        points[owner].append(_position(point))
    return [{"id": node_id, "points": points[node_id], "slots": None} for node_id in part.node_ids]


def _slot_nodes(part: SlotPartitioner) -> tuple[list[dict[str, Any]], list[list[Any]]]:
    counts = dict.fromkeys(part.node_ids, 0)
    ranges: list[list[Any]] = []
    for start, end, owner in part.ranges():
        counts[owner] += end - start + 1
        ranges.append([start, end, owner])
    nodes = [{"id": node_id, "points": None, "slots": counts[node_id]} for node_id in part.node_ids]
    return nodes, ranges


def layout(epoch: int, part: Partitioner) -> dict[str, Any]:
    """The JSON document of `GET /v1/cluster/ring` for `part` at `epoch`.

    ``{"epoch", "partitioner", "vnodes", "nodes": [{"id", "points", "slots"}], "ranges"}``:
    in ring mode each node's ``points`` are its virtual nodes' positions on the ring (sorted
    fractions in [0, 1); the arc ending at a point belongs to that point's node) and
    ``slots``/``ranges`` are null; in slots mode ``slots`` is each node's slot count,
    ``ranges`` the table as ``[start, end_inclusive, node_id]`` and ``points``/``vnodes`` null.
    """
    if isinstance(part, RingPartitioner):
        return {
            "epoch": epoch,
            "partitioner": part.kind,
            "vnodes": part.vnodes,
            "nodes": _ring_nodes(part),
            "ranges": None,
        }
    if isinstance(part, SlotPartitioner):
        nodes, ranges = _slot_nodes(part)
        return {
            "epoch": epoch,
            "partitioner": part.kind,
            "vnodes": None,
            "nodes": nodes,
            "ranges": ranges,
        }
    raise TypeError(f"no layout view for a {type(part).__name__}")


class RingView:
    """The encoded layout of the latest topology seen, rebuilt only when the epoch changes."""

    def __init__(self) -> None:
        self._epoch = -1
        self._partitioner: Partitioner | None = None
        self._body = b""

    def body(self, topology: Topology) -> bytes:
        """The JSON body for `topology` (cached while its epoch and partitioner stay)."""
        if topology.epoch != self._epoch or topology.partitioner is not self._partitioner:
            self._body = orjson.dumps(layout(topology.epoch, topology.partitioner))
            self._epoch = topology.epoch
            self._partitioner = topology.partitioner
        return self._body
