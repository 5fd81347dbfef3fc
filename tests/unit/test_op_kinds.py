"""Op kinds are an enum whose members travel as the plain strings they always were."""

from __future__ import annotations

import msgspec
import pytest

from cluster import wire
from cluster.wire import OpKind
from node.batch.ops import parse_op
from node.errors import BadOp

FIXED = ["fixed_window", 10, 60_000, 0, "", "", None, 2]


def _op(kind: str, undo: bytes | None = None) -> wire.Op:
    return wire.Op(kind, "user:1", "~inline", [FIXED], [0], cost=1, undo=undo)


def test_a_kind_member_encodes_as_its_string() -> None:
    for kind in OpKind:
        as_member = msgspec.msgpack.encode(_op(kind))
        as_string = msgspec.msgpack.encode(_op(kind.value))
        assert as_member == as_string
        decoded = msgspec.msgpack.decode(as_member, type=wire.Op)
        assert decoded.kind == kind and type(decoded.kind) is str
        batch = wire.encode(wire.Batch(1, [_op(kind)]))
        assert wire.decode_batch(batch).ops[0].kind == kind.value


def test_parse_op_gives_the_member_itself() -> None:
    op = parse_op(_op("check"))
    assert op.kind is OpKind.CHECK
    undo = parse_op(_op("undo", undo=b"\x90"))
    assert undo.kind is OpKind.UNDO


def test_an_unknown_kind_fails_its_op_only() -> None:
    body = wire.encode(wire.Batch(1, [_op("check"), _op("explode")]))
    ops = wire.decode_batch(body).ops
    assert parse_op(ops[0]).kind is OpKind.CHECK
    with pytest.raises(BadOp, match="op must be"):
        parse_op(ops[1])
