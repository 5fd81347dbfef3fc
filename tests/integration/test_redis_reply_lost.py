"""A batch's reply from Redis lost or late.

Lost: the node's connection to its Redis closes after a batch ran there, before its
reply came, and whether the batch ran is unknown to the node. Checks that carry a request_id are sent
again and answered from their record, counted once; the other ops are answered
undecided (checks: degraded), and may have been applied (the documented ambiguous case).
The node, its Redis answering, stays up.

Late: a reply held up past the batch's deadline, while the router, having given up,
sends the check again and is answered from its record. The first consumption then
stands: it is not taken back when its own reply finally comes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
import redis

from cluster import wire
from cluster.local.redis_proc import RedisProcess
from cluster.model.errors import Problems
from cluster.model.keys import INLINE_SCOPE, record_key
from cluster.model.limits import parse_limit
from node.app import STATE
from tests.conftest import Cluster, eventually, node_batch, start_cluster, stop_cluster

QUOTA = {"algorithm": "fixed_window", "limit": 5, "window": "3660d"}


class ReplyDropper:
    """A TCP relay in front of a Redis. Once armed with a marker, the connection whose
    request carries it is cut when Redis' next reply on it comes: the command ran, and its
    reply never reaches the client. `stall_s` holds that reply (and what follows it on
    the connection) up first; `cut_after` False passes it on then: the link stalled,
    nothing was lost. `times`: how many requests carrying the marker meet the fault."""

    def __init__(self, redis_port: int) -> None:
        self.redis_port = redis_port
        self.marker: bytes | None = None
        self.stall_s = 0.0
        self.cut_after = True
        self.times = 1
        self.cut = 0
        self.stalled = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        redis_r, redis_w = await asyncio.open_connection("127.0.0.1", self.redis_port)
        doomed = asyncio.Event()

        async def to_redis() -> None:
            while data := await client_r.read(65536):
                if self.marker is not None and self.marker in data:
                    self.times -= 1
                    if self.times == 0:
                        self.marker = None
                    doomed.set()  # before Redis can answer it
                redis_w.write(data)
                await redis_w.drain()
            redis_w.close()

        async def to_client() -> None:
            while data := await redis_r.read(65536):
                if doomed.is_set():
                    doomed.clear()
                    if self.stall_s:
                        self.stalled += 1
                        await asyncio.sleep(self.stall_s)  # the fault: a stalled link
                    if self.cut_after:
                        self.cut += 1
                        client_w.transport.abort()
                        redis_w.transport.abort()
                        return
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        with contextlib.suppress(OSError):
            await asyncio.gather(to_redis(), to_client())


@pytest.fixture
async def dropped(
    redis_servers: list[RedisProcess], tmp_path: Path
) -> AsyncIterator[tuple[Cluster, ReplyDropper]]:
    dropper = ReplyDropper(redis_servers[0].port)
    relayed = RedisProcess(port=await dropper.start(), data_dir=tmp_path / "relayed", aof=False)
    cluster = await start_cluster([relayed, *redis_servers[1:]], tmp_path)
    # The scripts loaded, the connections open: what is cut below is the check's reply.
    _, warm = await cluster.check({"key": n1_key(cluster, "warm"), "limits": [QUOTA]})
    assert warm["degraded"] is False, warm
    try:
        yield cluster, dropper
    finally:
        await stop_cluster(cluster)
        await dropper.close()


def check_op(key: str, cost: int, request_id: str | None = None) -> wire.Op:
    """A check of QUOTA as a router sends it to a node."""
    spec = parse_limit(QUOTA, "limits[0]", Problems())
    assert spec is not None
    return wire.Op(
        "check", key, "~inline", [spec.to_wire()], [0], cost, request_id, record_ttl_ms=600_000
    )


def n1_key(cluster: Cluster, prefix: str) -> str:
    return next(k for i in range(1000) if cluster.router.view.owner(k := f"{prefix}:{i}") == "n1")


async def test_checks_with_a_request_id_are_sent_again_and_count_once(
    dropped: tuple[Cluster, ReplyDropper],
) -> None:
    cluster, dropper = dropped
    key = n1_key(cluster, "lost-with-id")
    dropper.marker = key.encode()
    status, body = await cluster.check({"key": key, "limits": [QUOTA], "request_id": "r-1"})
    assert dropper.cut == 1
    # The first send ran: the second is answered from its record.
    assert status == 200 and body["degraded"] is False and body["replayed"] is True, body
    assert body["limits"][0]["remaining"] == 4
    _, usage = await cluster.check({"key": key, "limits": [QUOTA], "cost": 0})
    assert usage["limits"][0]["remaining"] == 4  # counted once


async def test_checks_without_one_answer_degraded_having_consumed(
    dropped: tuple[Cluster, ReplyDropper],
) -> None:
    """Nothing to send again, and Redis answers: the checks are answered as possibly
    applied, one by one, and the node stays up."""
    cluster, dropper = dropped
    key = n1_key(cluster, "lost-without-id")
    dropper.marker = key.encode()
    status, body = await cluster.check({"key": key, "limits": [QUOTA]})
    assert dropper.cut == 1
    assert status == 200 and body["degraded"] is True, body
    assert body["degraded_reason"].startswith("error: connection to Redis lost"), body
    assert body["degraded_reason"].endswith("this op may have been applied"), body
    _, usage = await cluster.check({"key": key, "limits": [QUOTA], "cost": 0})
    assert usage["degraded"] is False, usage  # not marked down
    assert usage["limits"][0]["remaining"] == 4  # it ran: the known ambiguous case


async def test_a_mixed_batch_sends_again_only_its_checks_with_a_request_id(
    dropped: tuple[Cluster, ReplyDropper],
) -> None:
    """Through the node's HTTP batch endpoint (the path of batches that pull moving keys
    or wait for a replica): the checks with a request_id are answered from their record,
    the other op is answered undecided, one by one."""
    cluster, dropper = dropped
    keys = [n1_key(cluster, f"lost-batch-{i}") for i in range(3)]
    ops = [check_op(key, 1, f"b-{i}" if i < 2 else None) for i, key in enumerate(keys)]
    dropper.marker = keys[0].encode()
    *sent_again, undecided = await node_batch(cluster, "n1", ops)
    assert dropper.cut == 1
    for result in sent_again:
        assert isinstance(result, wire.Checked) and result.allowed and result.replayed, result
    assert isinstance(undecided, wire.Failed) and not undecided.refused, undecided
    assert undecided.detail.endswith("this op may have been applied"), undecided
    reads = [check_op(key, 0) for key in keys]
    for read in await node_batch(cluster, "n1", reads):
        assert isinstance(read, wire.Checked) and read.limits[0].remaining == 4, read  # once


async def test_a_late_first_reply_is_not_taken_back_once_a_replay_answered(
    dropped: tuple[Cluster, ReplyDropper],
) -> None:
    cluster, dropper = dropped
    key = n1_key(cluster, "late")
    node = cluster.runners[0].app[STATE]  # n1's
    dropper.marker, dropper.stall_s = key.encode(), 3.0  # past the 2 s deadline + margin
    dropper.cut_after = False
    body = {"key": key, "limits": [QUOTA], "request_id": "late-1"}
    status, answer = await cluster.check(body)
    assert dropper.stalled == 1
    # The router gave up on the first send and sent the check again: its record answered.
    assert status == 200 and answer["degraded"] is False and answer["replayed"] is True, answer
    assert answer["limits"][0]["remaining"] == 4

    async def late_reply_handled() -> bool:
        return bool(node.expired_batches == 1)

    await eventually(late_reply_handled)
    assert node.undone_checks == 0  # the first send's consumption stands
    _, usage = await cluster.check({"key": key, "limits": [QUOTA], "cost": 0})
    assert usage["limits"][0]["remaining"] == 4  # counted once, as answered
    _, again = await cluster.check(body)
    assert again["replayed"] is True and again["limits"][0]["remaining"] == 4, again


async def test_a_check_is_sent_again_after_a_second_lost_connection(
    dropped: tuple[Cluster, ReplyDropper],
) -> None:
    cluster, dropper = dropped
    key = n1_key(cluster, "lost-twice")
    dropper.marker, dropper.times = key.encode(), 2
    status, body = await cluster.check({"key": key, "limits": [QUOTA], "request_id": "r-2"})
    assert dropper.cut == 2
    assert status == 200 and body["degraded"] is False and body["replayed"] is True, body
    _, usage = await cluster.check({"key": key, "limits": [QUOTA], "cost": 0})
    assert usage["limits"][0]["remaining"] == 4  # counted once


async def test_a_check_sent_again_past_its_deadline_is_taken_back_by_its_record(
    dropped: tuple[Cluster, ReplyDropper],
) -> None:
    """The reply held past the batch's deadline, then lost: the node's second send is
    refused by the deadline, and the first send's consumption is given back by the
    check's record, so its `Expired` answer consumed nothing."""
    cluster, dropper = dropped
    node = cluster.runners[0].app[STATE]  # n1's
    key = n1_key(cluster, "lost-late")
    op = check_op(key, 1, "late-2")
    dropper.marker, dropper.stall_s = key.encode(), 1.5
    [result] = await node_batch(cluster, "n1", [op], within_ms=1000)
    assert (dropper.stalled, dropper.cut) == (1, 1)
    assert isinstance(result, wire.Expired), result
    assert node.undone_checks == 1
    read = check_op(key, 0)
    [after] = await node_batch(cluster, "n1", [read])
    assert isinstance(after, wire.Checked) and after.limits[0].remaining == 5, after
    [again] = await node_batch(cluster, "n1", [op])  # a new decision: its record is gone
    assert isinstance(again, wire.Checked) and not again.replayed, again


async def test_a_replay_marks_its_record_once_and_a_dry_run_writes_nothing(
    dropped: tuple[Cluster, ReplyDropper],
) -> None:
    cluster, dropper = dropped
    key = n1_key(cluster, "marked")
    stored = redis.Redis(port=dropper.redis_port)  # n1's Redis itself
    record = record_key(INLINE_SCOPE, "m-1", key)
    body = {"key": key, "limits": [QUOTA], "request_id": "m-1"}
    await cluster.check(body)
    first = stored.get(record)
    await cluster.check({**body, "dry_run": True})
    assert stored.get(record) == first  # a dry run writes nothing
    _, replay = await cluster.check(body)
    assert replay["replayed"] is True
    marked = stored.get(record)
    assert isinstance(marked, bytes) and marked != first
    assert msgspec.msgpack.decode(marked)["replayed"] == 1
    await cluster.check(body)
    assert stored.get(record) == marked  # marked once
    stored.close()
