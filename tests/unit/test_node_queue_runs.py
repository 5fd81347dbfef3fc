"""A node's queue holds runs of ops: split where a node batch fills up, each op still
answered in its own place."""

from __future__ import annotations

import asyncio
from typing import Any

from cluster import wire
from cluster.model.nodes import NodeSpec
from router.channel.link import Done
from router.channel.node_client import NodeClient
from router.errors import NodeUnavailable, Reason


def _op(key: str) -> wire.Op:
    return wire.Op("check", key, "api", [["fixed_window", 10, 60_000]], [0])


def _checked(key: str) -> wire.Checked:
    return wire.Checked(True, False, [wire.LimitRow(1, 10, len(key), 0, -1, -1, -1, -1)])


class _Link:
    """Records every batch sent; answers none until told."""

    def __init__(self) -> None:
        self.sent: list[tuple[list[wire.Op], Done]] = []

    def send(
        self, _deadline_ms: int, ops: list[wire.Op], _timeout: float, done: Done, **_: Any
    ) -> None:
        self.sent.append((ops, done))

    def close(self) -> None:
        pass


def _channel() -> tuple[NodeClient, _Link]:
    channel = NodeClient(
        NodeSpec("n1", "http://127.0.0.1:9"),
        None,
        deadline_s=1.0,
        margin_s=0.25,
        max_inflight=1,
        queue_max=100,
        coalesce_max=3,
    )
    link = _Link()
    channel.queue.link = link  # type: ignore[assignment]
    return channel, link


def _answer(link: _Link, index: int) -> None:
    ops, done = link.sent[index]
    results: list[wire.Result] = [_checked(op.key) for op in ops]
    done(wire.Reply(index + 1, 200, wire.BatchReply(1, "n1", 0, results)))


async def test_runs_split_at_the_batch_size_and_answer_each_op_in_its_place() -> None:
    channel, link = _channel()
    keys = [f"k{'x' * i}" for i in range(7)]
    group = channel.submit_group([_op(k) for k in keys[:5]])
    single = channel.submit(_op(keys[5]))
    other = channel.submit_group([_op(keys[6])])
    assert channel.queued == 7
    for index in range(3):
        await asyncio.sleep(0)  # the flush
        assert len(link.sent) == index + 1
        _answer(link, index)
    assert [[op.key for op in ops] for ops, _ in link.sent] == [keys[:3], keys[3:6], keys[6:]]
    assert channel.queued == 0
    assert await group.future == [_checked(k) for k in keys[:5]]
    assert await single == _checked(keys[5])
    assert await other.future == [_checked(keys[6])]
    await channel.close()


async def test_a_failed_batch_fails_every_op_of_its_runs_and_only_those() -> None:
    channel, link = _channel()
    group = channel.submit_group([_op(f"k{i}") for i in range(4)])
    await asyncio.sleep(0)
    _, done = link.sent[0]
    done(wire.Reply(1, 500, detail="boom"))
    assert group.outcomes[3] is None and not group.future.done()
    await asyncio.sleep(0)
    _answer(link, 1)
    outcomes = await group.future
    assert all(isinstance(o, NodeUnavailable) and o.reason is Reason.ERROR for o in outcomes[:3])
    assert len({id(o) for o in outcomes[:3]}) == 3  # an exception of its own per op
    assert outcomes[3] == _checked("k3")
    await channel.close()


async def test_marked_down_fails_what_is_queued_and_not_what_is_in_flight() -> None:
    channel, link = _channel()
    group = channel.submit_group([_op(f"k{i}") for i in range(5)])
    await asyncio.sleep(0)
    channel.watchdog.mark_down("test")
    assert channel.queued == 0
    assert group.outcomes[:3] == [None] * 3
    assert all(
        isinstance(o, NodeUnavailable) and o.reason is Reason.DOWN for o in group.outcomes[3:]
    )
    _answer(link, 0)
    assert (await group.future)[:3] == [_checked(f"k{i}") for i in range(3)]
    await channel.close()
