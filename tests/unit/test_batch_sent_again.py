"""Which ops of a batch go again once the connection to Redis was lost under it
(node/batch/lost_reply.py; the whole path, with a real relay cutting a real Redis'
replies, is tests/integration/test_redis_reply_lost.py)."""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError

from cluster import wire
from cluster.model.errors import Problems
from cluster.model.limits import parse_limit
from node.batch.lost_reply import keep_resendable
from node.batch.ops import parse_op
from node.batch.prepared import PreparedBatch

LIMIT = {"algorithm": "fixed_window", "limit": 5, "window": "1h"}
LOST = RedisConnectionError("connection to Redis lost: closed")


def _batch(*ops: wire.Op) -> PreparedBatch:
    batch = PreparedBatch(deadline_ms=1, size=len(ops), ownership=None, failovers=0)
    batch.runnable = [parse_op(op) for op in ops]
    batch.slots = list(range(len(ops)))
    return batch


def _check(key: str, request_id: str | None = None, durable: bool = False) -> wire.Op:
    spec = parse_limit(LIMIT, "limits[0]", Problems())
    assert spec is not None
    limits = [spec.to_wire()]
    return wire.Op("check", key, "~inline", limits, [0], 1, request_id, durable=durable)


def test_only_checks_with_a_request_id_go_again_and_not_durable_ones() -> None:
    refund = wire.Op("refund", "d", "~inline", _check("d").limits, [0], 1, "r-4")
    batch = _batch(_check("a", "r-1"), _check("b"), _check("c", "r-3", durable=True), refund)
    assert keep_resendable(batch, LOST)
    assert [op.key for op in batch.runnable] == ["a"] and batch.slots == [0]
    for index in (1, 2, 3):
        result = batch.results[index]
        assert isinstance(result, wire.Failed) and not result.refused
        assert result.detail == "connection to Redis lost: closed: this op may have been applied"


def test_with_nothing_to_send_again_every_op_is_answered_undecided() -> None:
    batch = _batch(_check("a"), _check("b", "r-2", durable=True))
    assert not keep_resendable(batch, LOST)
    assert batch.runnable == [] and batch.slots == []
    assert all(isinstance(r, wire.Failed) for r in batch.results)
