"""The hot-path channel router→node (cluster/wire/channel.py frames, node/edge/channel_server.py,
router/channel/link.py): one long-lived connection per node, replies matched by id, the cluster
token checked first, nothing applied past a frame's deadline."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from cluster import wire
from cluster.model.errors import Problems
from cluster.model.limits import parse_limit
from node.app import STATE
from router.channel.link import NodeLink
from tests.conftest import CLUSTER, RULES, Cluster, cluster_with_rules

cluster = cluster_with_rules(RULES)
LIMIT = {"algorithm": "fixed_window", "limit": 5, "window": "1h"}


def check_op(key: str, cost: int = 1) -> wire.Op:
    spec = parse_limit(LIMIT, "limits[0]", Problems())
    assert spec is not None
    return wire.Op("check", key, "~inline", [spec.to_wire()], [0], cost=cost)


async def channel_port(cluster: Cluster, node: str) -> int:
    async with cluster.http.get(cluster.node_urls[node] + wire.HEALTH_PATH) as resp:
        port = (await resp.json())["channel"]
    assert isinstance(port, int)
    return port


async def exchange(port: int, *frames: Any) -> list[Any]:
    """Write frames on a fresh connection; every frame the node sends until it closes
    or has answered each request."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"".join(wire.frame(f) for f in frames))
    expected = sum(isinstance(f, wire.Request) for f in frames) + 1
    buffer, got = wire.FrameBuffer(), list[Any]()
    while len(got) < expected:
        data = await reader.read(65536)
        if not data:
            break
        got += [wire.decode_channel_out(body) for body in buffer.feed(data)]
    writer.close()
    return got


async def test_checks_share_one_long_lived_connection_per_node(cluster: Cluster) -> None:
    for i in range(30):
        status, body = await cluster.check({"key": f"conn:{i}", "limits": [LIMIT]})
        assert status == 200 and body["degraded"] is False
    channels = cluster.router.view.clients.values()
    used = [c for c in channels if c.requests > 0]
    assert used and all(c.active.link.connects == 1 for c in used)
    assert sum(c.ops for c in channels) == 30


async def test_the_node_refuses_a_channel_without_the_cluster_token(cluster: Cluster) -> None:
    port = await channel_port(cluster, "n1")
    request = wire.Request(1, int(time.time() * 1000) + 5000, [check_op("tok:1")])
    for hello in (wire.Hello("wrong"), wire.Hello(None)):
        answers = await exchange(port, hello, request)
        assert answers == [wire.Refused("cluster token required")]
    # A request before any hello is refused as well, and nothing was counted.
    assert await exchange(port, request) == [
        wire.Refused("a channel opens with one hello, then carries batches")
    ]
    status, body = await cluster.check({"key": "tok:1", "limits": [LIMIT], "cost": 0})
    assert status == 200 and body["limits"][0]["remaining"] == 5


async def test_a_frame_past_its_deadline_is_answered_expired_and_applies_nothing(
    cluster: Cluster,
) -> None:
    key = "late:frame"
    owner = cluster.router.view.owner(key)
    port = await channel_port(cluster, owner)
    past = wire.Request(7, int(time.time() * 1000) - 1, [check_op(key, cost=3)])
    fresh = wire.Request(8, int(time.time() * 1000) + 5000, [check_op(key, cost=2)])
    welcome, *replies = await exchange(port, wire.Hello(CLUSTER), past, fresh)
    assert isinstance(welcome, wire.Welcome) and welcome.node == owner
    by_id = {reply.id: reply for reply in replies}
    assert sorted(by_id) == [7, 8]
    assert by_id[7].status == 200 and by_id[7].reply is not None
    assert by_id[7].reply.results == [wire.Expired()]
    checked = by_id[8].reply.results[0] if by_id[8].reply is not None else None
    assert isinstance(checked, wire.Checked) and checked.limits[0].remaining == 3
    status, body = await cluster.check({"key": key, "limits": [LIMIT], "cost": 0})
    assert status == 200 and body["limits"][0]["remaining"] == 3


async def test_ops_placed_by_another_layout_are_placed_again_by_the_node(
    cluster: Cluster,
) -> None:
    """A frame says by which layout the router placed its ops; the node takes that
    placement only when the layout is its own: a key it does not own in a frame of
    another layout (or none) is `moved`, and nothing is counted for it."""
    view = cluster.router.view
    layout = view.topology.layout_id
    node_state = cluster.runners[0].app[STATE]  # n1's
    assert node_state.topology is not None and node_state.topology.layout_id == layout
    mine = next(f"placed:{i}" for i in range(100) if view.owner(f"placed:{i}") == "n1")
    other = next(f"placed:{i}" for i in range(100) if view.owner(f"placed:{i}") != "n1")
    port = await channel_port(cluster, "n1")
    deadline = int(time.time() * 1000) + 5000
    placed = wire.Request(1, deadline, [check_op(mine)], layout)
    frames = [
        wire.Request(i, deadline, [check_op(mine), check_op(other)], stamp)
        for i, stamp in enumerate((layout ^ 1, 0, 12345), start=2)
    ]
    welcome, *replies = await exchange(port, wire.Hello(CLUSTER), placed, *frames)
    assert isinstance(welcome, wire.Welcome)
    by_id = {reply.id: reply.reply for reply in replies}
    assert sorted(by_id) == [1, 2, 3, 4]
    remaining = []
    for reply in by_id.values():
        assert reply is not None
        checked, *moved = reply.results
        assert isinstance(checked, wire.Checked) and checked.allowed
        remaining.append(checked.limits[0].remaining)
        assert moved == ([] if reply is by_id[1] else [wire.Moved(welcome.epoch)])
    assert sorted(remaining) == [1, 2, 3, 4]
    for key, left in ((mine, 1), (other, 5)):
        status, body = await cluster.check({"key": key, "limits": [LIMIT], "cost": 0})
        assert status == 200 and body["limits"][0]["remaining"] == left


async def refusal_of_a_frame(port: int, length: int, *first: Any) -> Any:
    """What the node answers to `first` frames then the header of a frame of `length`
    bytes, before it closes the connection (the Welcome to a Hello left out)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"".join(wire.frame(f) for f in first) + wire.FRAME_HEADER.pack(length))
    data = await reader.read()  # until the node closes
    writer.close()
    answers = [wire.decode_channel_out(body) for body in wire.FrameBuffer().feed(data)]
    return answers[-1]


async def test_an_oversized_frame_is_refused(cluster: Cluster) -> None:
    port = await channel_port(cluster, "n1")
    most = wire.MAX_FRAME_BYTES
    refused = await refusal_of_a_frame(port, most + 1, wire.Hello(CLUSTER))
    assert refused == wire.Refused(f"frame of {most + 1} bytes (at most {most})")


async def test_before_its_hello_a_connection_may_send_no_large_frame(cluster: Cluster) -> None:
    """What a client without the token can make a node hold: one Hello-sized frame. Once
    welcomed, the connection takes frames of any size up to MAX_FRAME_BYTES."""
    port = await channel_port(cluster, "n1")
    most = wire.MAX_HELLO_BYTES
    refused = await refusal_of_a_frame(port, most + 1)
    assert refused == wire.Refused(f"frame of {most + 1} bytes (at most {most})")
    ops = [check_op(f"big:{i}") for i in range(2000)]
    request = wire.Request(7, int(time.time() * 1000) + 5000, ops)
    assert len(wire.frame(request)) > wire.MAX_HELLO_BYTES
    welcome, reply = await exchange(port, wire.Hello(CLUSTER), request)
    assert isinstance(welcome, wire.Welcome)
    assert isinstance(reply, wire.Reply) and (reply.id, reply.status) == (7, 200), reply


async def test_a_connection_without_a_hello_is_closed(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    from node.edge import channel_server

    monkeypatch.setattr(channel_server, "HELLO_WAIT_S", 0.3)
    port = await channel_port(cluster, "n1")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    async with asyncio.timeout(10):
        data = await reader.read()  # until the node closes
    writer.close()
    [refused] = wire.FrameBuffer().feed(data)
    assert wire.decode_channel_out(refused) == wire.Refused("no hello within 0.3 s")
    # A router's connection, welcomed, stays open past that.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(wire.frame(wire.Hello(CLUSTER)))
    buffer = wire.FrameBuffer()
    [welcome] = buffer.feed(await reader.read(65536))
    assert isinstance(wire.decode_channel_out(welcome), wire.Welcome)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(1.0):
            await reader.read(1)
    writer.close()


async def test_a_hello_whose_token_is_not_utf8_is_refused(cluster: Cluster) -> None:
    """msgpack of a Hello whose token string holds a byte UTF-8 cannot start with."""
    port = await channel_port(cluster, "n1")
    hello = wire.frame(wire.Hello("x" * 8))
    body = hello.replace(b"x" * 8, b"\xff" + b"x" * 7)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(body)
    data = await reader.read()  # until the node closes
    writer.close()
    [refused] = wire.FrameBuffer().feed(data)
    answer = wire.decode_channel_out(refused)
    assert isinstance(answer, wire.Refused) and "not UTF-8" in answer.detail, answer


# ------------------------------------------------- the router's end, against a real server


@pytest.fixture
async def reversing_node() -> AsyncIterator[tuple[int, list[Any]]]:
    """A channel server that welcomes anyone, holds requests until it has two, then
    answers them in reverse order; it records every frame it received."""
    received: list[Any] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        buffer, held = wire.FrameBuffer(), []
        while data := await reader.read(65536):
            for body in buffer.feed(data):
                message = wire.decode_channel_in(body)
                received.append(message)
                if isinstance(message, wire.Hello):
                    writer.write(wire.frame(wire.Welcome("fake", 3, 0)))
                else:
                    held.append(message)
            if len(held) == 2:
                for request in reversed(held):
                    results: list[wire.Result] = [wire.Moved(len(request.ops))]
                    reply = wire.BatchReply(3, "fake", 0, results)
                    writer.write(wire.frame(wire.Reply(request.id, 200, reply)))
                held.clear()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port: int = server.sockets[0].getsockname()[1]
    yield port, received
    server.close()


async def test_replies_are_matched_by_id_whatever_their_order(
    reversing_node: tuple[int, list[Any]],
) -> None:
    port, received = reversing_node

    async def discover(_timeout: float) -> int:
        return port

    link = NodeLink("http://127.0.0.1:1", "secret", discover, connect_timeout_s=5.0)
    outcomes: dict[str, wire.Reply | BaseException] = {}
    done = asyncio.Event()

    def keep(name: str) -> Any:
        def got(outcome: wire.Reply | BaseException) -> None:
            outcomes[name] = outcome
            if len(outcomes) == 2:
                done.set()

        return got

    deadline = int(time.time() * 1000) + 5000
    link.send(deadline, [check_op("a")], 5.0, keep("one op"))
    link.send(deadline, [check_op("b"), check_op("c")], 5.0, keep("two ops"))
    await asyncio.wait_for(done.wait(), 10)
    one, two = outcomes["one op"], outcomes["two ops"]
    assert isinstance(one, wire.Reply) and isinstance(two, wire.Reply)
    assert one.reply is not None and one.reply.results == [wire.Moved(1)]
    assert two.reply is not None and two.reply.results == [wire.Moved(2)]
    assert received[0] == wire.Hello("secret")
    assert [r.id for r in received[1:]] == [1, 2] and link.connects == 1
    assert link.waiting == 0
    link.close()


async def test_a_batch_without_a_reply_times_out_and_a_late_reply_is_handed_over() -> None:
    """One batch, no answer in its time: TimeoutError; the answer that comes later goes
    to on_late (the router takes back what it consumed)."""
    release = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        buffer = wire.FrameBuffer()
        while data := await reader.read(65536):
            for body in buffer.feed(data):
                message = wire.decode_channel_in(body)
                if isinstance(message, wire.Hello):
                    writer.write(wire.frame(wire.Welcome("slow", 1, 0)))
                    continue
                await release.wait()
                reply = wire.BatchReply(1, "slow", 0, [wire.Undone(1)])
                writer.write(wire.frame(wire.Reply(message.id, 200, reply)))
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port: int = server.sockets[0].getsockname()[1]

    async def discover(_timeout: float) -> int:
        return port

    link = NodeLink("http://127.0.0.1:1", None, discover, connect_timeout_s=5.0)
    outcome: asyncio.Future[wire.Reply | BaseException] = asyncio.get_running_loop().create_future()
    late: asyncio.Future[wire.Reply] = asyncio.get_running_loop().create_future()
    link.send(
        int(time.time() * 1000) + 100, [check_op("x")], 0.2, outcome.set_result, late.set_result
    )
    assert isinstance(await asyncio.wait_for(outcome, 10), TimeoutError)
    assert link.waiting == 1  # kept for its late reply
    release.set()
    reply = await asyncio.wait_for(late, 10)
    assert reply.reply is not None and reply.reply.results == [wire.Undone(1)]
    assert link.waiting == 0
    link.close()
    server.close()


async def test_health_names_the_channel_port(cluster: Cluster) -> None:
    for url in cluster.node_urls.values():
        async with cluster.http.get(url + wire.HEALTH_PATH) as resp:
            health = orjson.loads(await resp.read())
        port = health["channel"]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
