"""node.migration.source_reads.sources_of: the nodes a node gains keys from in a migration,
against the owners the partitioners give a sample of keys."""

from __future__ import annotations

import random

import pytest

from cluster.model.nodes import NodeSpec
from cluster.model.partition import Partitioner, RingPartitioner, SlotPartitioner
from cluster.model.topology import Topology
from node.migration.source_reads import sources_of
from node.topology.ownership import Ownership

NODES = [NodeSpec(f"n{i}", f"http://127.0.0.1:{7000 + i}") for i in range(1, 5)]
KEYS = [f"user:{i}" for i in random.Random(3).sample(range(10**7), 20_000)]


def gained_from(me: str, old: Partitioner, new: Partitioner) -> list[str]:
    return sorted({old.owner(k) for k in KEYS if new.owner(k) == me and old.owner(k) != me})


@pytest.mark.parametrize("kind", ["ring", "slots"])
@pytest.mark.parametrize("change", ["add", "remove"])
def test_the_sources_are_the_owners_a_node_gains_keys_from(kind: str, change: str) -> None:
    three = RingPartitioner(NODES[:3]) if kind == "ring" else SlotPartitioner(NODES[:3])
    four = three.resized(NODES)
    old, new = (three, four) if change == "add" else (four, three)
    topology = Topology(2, new, {"id": "m1", "from": old.to_dict()})
    for spec in new.nodes:
        expected = gained_from(spec.id, old, new)
        assert sorted(sources_of(Ownership.build(spec.id, topology))) == expected
    if change == "add":
        assert sorted(sources_of(Ownership.build("n4", topology))) == ["n1", "n2", "n3"]
    else:
        assert sources_of(Ownership.build("n1", topology)) == ["n4"]


def test_a_node_outside_a_migration_has_no_sources() -> None:
    ring = RingPartitioner(NODES[:3])
    assert sources_of(Ownership.build("n1", Topology(1, ring))) == []
