"""The node hot path's caches answer exactly what the uncached work would."""

from __future__ import annotations

import random

import pytest

from cluster.model.limits import LimitSpec
from cluster.model.nodes import NodeSpec
from cluster.model.partition import RingPartitioner, SlotPartitioner
from cluster.model.topology import Topology
from cluster.wire import Op as WireOp
from node.batch.ops import parse_op
from node.errors import BadOp
from node.topology.ownership import Ownership, Role

NODES = [NodeSpec(f"n{i}", f"http://n{i}") for i in (1, 2, 3)]
LIMIT = LimitSpec("fixed_window", 1, 60_000).to_wire()


def _check(limits: list[list[object]]) -> WireOp:
    return WireOp("check", "user:1", "api", limits, [0] * len(limits))


def test_a_limits_list_is_validated_by_its_exact_values_and_types() -> None:
    first = parse_op(_check([list(LIMIT)]))
    assert parse_op(_check([list(LIMIT)])).limits is first.limits  # validated once
    # True == 1 and 1.0 == 1 in Python: the cached int form must not let them through.
    for odd in (True, 1.0):
        bad = list(LIMIT)
        bad[1] = odd
        with pytest.raises(BadOp):
            parse_op(_check([bad]))
    with pytest.raises(BadOp):
        parse_op(_check([]))


def test_a_bad_scope_is_refused_after_good_ones_were_seen() -> None:
    assert parse_op(WireOp("check", "k", "api", [list(LIMIT)], [0])).scope == "api"
    with pytest.raises(BadOp, match="bad scope"):
        parse_op(WireOp("check", "k", "no spaces", [list(LIMIT)], [0]))


def test_a_key_is_measured_in_bytes() -> None:
    assert parse_op(WireOp("check", "é" * 256, "api", [list(LIMIT)], [0])).key
    with pytest.raises(BadOp, match="512 bytes"):
        parse_op(WireOp("check", "é" * 257, "api", [list(LIMIT)], [0]))


@pytest.mark.parametrize("kind", ["ring", "slots"])
def test_the_roles_cache_answers_what_the_partitioners_do(kind: str) -> None:
    old = RingPartitioner(NODES[:2]) if kind == "ring" else SlotPartitioner(NODES[:2])
    new = old.resized(NODES)
    migration = {"id": "m1", "from": old.to_dict()}
    keys = [f"user:{random.randrange(10**6)}" for _ in range(2000)] + ["a{tag}b", "c{tag}d"]
    for topology in (Topology(2, new), Topology(3, new, migration)):
        ownership = Ownership.build("n3", topology)
        for _ in range(2):  # computed, then cached
            for key in keys:
                expected: tuple[Role, str | None] = (Role.OWN, None)
                if new.owner(key) != "n3":
                    expected = (Role.MOVED, None)
                elif topology.migration and old.owner(key) != "n3":
                    expected = (Role.IMPORT, old.owner(key))
                assert ownership.role(key) == expected
