"""A partitioner built anew, or rebuilt from its stored state (`Partitioner.to_dict`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cluster.model.nodes import NodeSpec
from cluster.model.partition.hashing import HASH_SLOTS
from cluster.model.partition.interface import (
    DEFAULT_VNODES,
    Partitioner,
    validate_nodes,
    validate_vnodes,
)
from cluster.model.partition.ring import RingPartitioner
from cluster.model.partition.slots import SlotPartitioner


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
        return RingPartitioner(nodes, vnodes=validate_vnodes(data.get("vnodes", DEFAULT_VNODES)))
    if kind == SlotPartitioner.kind:
        raw_slots = data.get("slots")
        if raw_slots is None:
            return SlotPartitioner(nodes)
        ids = validate_nodes(nodes)
        return SlotPartitioner(ids, _table_from_ranges(raw_slots, {n.id for n in ids}))
    raise ValueError(f"unknown partitioner kind {kind!r} (expected 'ring' or 'slots')")


def new_partitioner(
    kind: str, nodes: Sequence[NodeSpec], *, vnodes: int = DEFAULT_VNODES
) -> Partitioner:
    """Return a fresh balanced layout of `kind` ("ring" or "slots") over `nodes`."""
    if kind == RingPartitioner.kind:
        return RingPartitioner(nodes, vnodes=vnodes)
    if kind == SlotPartitioner.kind:
        validate_vnodes(vnodes)
        return SlotPartitioner(nodes)
    raise ValueError(f"unknown partitioner kind {kind!r} (expected 'ring' or 'slots')")
