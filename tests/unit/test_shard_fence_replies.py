"""A call the shard's epoch fence refused stands for each of its ops, as `Moved` with the
shard's epoch; calls it did not refuse keep their own replies."""

from __future__ import annotations

from typing import Any

from cluster import wire
from node.store.replies import FENCED, assemble, check_result, fenced_epoch
from node.store.script_calls import Plan


def plan(batched: list[int], others: list[int]) -> Plan:
    ops: list[Any] = [None] * (len(batched) + len(others))
    return Plan(ops, 0, 7, [batched] if batched else [], others, [])


def test_a_fenced_reply_names_the_shards_epoch_and_nothing_else_does() -> None:
    assert fenced_epoch([FENCED, 9]) == 9
    assert fenced_epoch([[FENCED, 9], [1, 0, 1]]) == 0  # two checks' replies
    assert fenced_epoch([-1]) == 0 and fenced_epoch(1) == 0 and fenced_epoch([0, 1]) == 0
    assert check_result([FENCED, 9]) == wire.Moved(9)


def test_a_refused_batch_call_stands_for_each_of_its_ops() -> None:
    refused = [FENCED, 9]
    assert assemble(plan([0, 1], []), [refused]) == [refused, refused]
    # The batch call refused; a refund after it in the same pipeline too.
    assert assemble(plan([0, 2], [1]), [refused, refused]) == [refused, refused, refused]


def test_a_call_refused_after_one_that_ran_keeps_the_first_ones_replies() -> None:
    checks = [[1, 0, 1, 1, 5, 4, 0, -1, -1, -1, -1], [1, 0, 1, 1, 5, 3, 0, -1, -1, -1, -1]]
    refused = [FENCED, 9]
    assert assemble(plan([0, 2], [1]), [checks, refused]) == [checks[0], refused, checks[1]]


def test_checks_split_over_calls_are_answered_in_their_places() -> None:
    ops: list[Any] = [None] * 5
    split = Plan(ops, 0, 7, [[0, 2], [3, 4]], [1], [])
    first, second, refund = [["a"], ["c"]], [["d"], ["e"]], 1
    assert assemble(split, [first, second, refund]) == [["a"], 1, ["c"], ["d"], ["e"]]
    refused = [FENCED, 9]  # the second call refused: it stands for each of its checks
    assert assemble(split, [first, refused, refund]) == [["a"], 1, ["c"], refused, refused]
    alone = Plan(ops[:4], 0, 7, [[0, 1], [2, 3]], [], [])
    assert assemble(alone, [first, second]) == [["a"], ["c"], ["d"], ["e"]]
