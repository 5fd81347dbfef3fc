"""A batch of ops and its reply: `Batch` (the router's ops, in order) and `BatchReply`
(one tagged `Result` per op, in order), positional msgpack arrays."""

from __future__ import annotations

import enum
from typing import Annotated, Any

import msgspec

from cluster.wire.codec import decoded, encoder

NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class OpKind(enum.StrEnum):
    """What an op does: a member equals, and encodes as, its plain string ("check")."""

    CHECK = "check"
    REFUND = "refund"
    COMMIT = "commit"
    UNDO = "undo"
    ADJUST = "adjust"
    RENEW = "renew"  # a concurrency limit's lease: renew it ...
    RELEASE = "release"  # ... or release it


class Op(msgspec.Struct, array_like=True, frozen=True):
    """One operation on one limit key. `limits` are LimitSpec.to_wire() lists.

    kind "undo" takes back a check the router answered degraded after giving up on
    its batch, whose answer came late and said it consumed: `undo` carries what
    that answer's `Checked.undo` said.
    """

    kind: str  # an OpKind value; a str here so an unknown kind fails that op, not the batch
    key: str
    scope: str
    limits: list[list[Any]]
    amounts: list[NonNegative]
    cost: NonNegative = 0
    request_id: str | None = None
    dry_run: bool = False
    void: bool = False  # refund: a rollback, replays then answer "denied"
    record_ttl_ms: NonNegative = 0
    hold_ms: NonNegative = 0  # all-or-nothing first phase
    batch: str | None = None  # a held check's batch id ...
    coordinator: str | None = None  # ... and the node holding its decision
    undo: bytes | None = None  # kind "undo": the undo entries of the check to take back
    quota_ttl_ms: NonNegative = 0  # quota limits: lifetime from last change (0: default)
    # kind "adjust": a quota's restock, [count_mode, count, amount_mode, amount] with
    # mode 0 = none, 1 = delta (remaining += value), 2 = set (remaining = value)
    adjust: list[int] | None = None
    # kind "check" with a request_id: what the id promises to repeat
    # (cluster/model/keys.py request_fingerprint); a record made for another answers Reused
    fingerprint: str | None = None
    durable: bool = False  # acknowledged only once a replica holds it (durability: replica)
    # kind "renew" / "release": the lease as [fencing, nonce, ttl_ms] (ttl_ms: renew only),
    # with `limits` holding the rule's one concurrency limit
    lease: list[int] | None = None


class Batch(msgspec.Struct, array_like=True, frozen=True):
    deadline_ms: Annotated[int, msgspec.Meta(gt=0)]
    ops: list[Op]


class LimitRow(msgspec.Struct, array_like=True, frozen=True):
    """One limit's state in a check's result; -1 stands for "none"."""

    ok: int
    limit: int
    remaining: int
    reset_after_ms: int
    retry_after_ms: int
    delay_ms: int
    max_amount: int
    amount_remaining: int


class Checked(msgspec.Struct, array_like=True, frozen=True, tag="checked"):
    allowed: bool
    replayed: bool
    limits: list[LimitRow]
    undo: bytes | None = None  # what it consumed, when it did (opaque: for an "undo" op)
    rolled_back: bool = False  # a replay of a check its all-or-nothing batch rolled back


class RefundStatus(enum.IntEnum):
    """What node/store/lua/refund.lua answers."""

    UNKNOWN = 0  # no decision with this key, rule and request_id
    REFUNDED = 1
    ALREADY_REFUNDED = 2
    NOTHING_CONSUMED = 3
    NOT_HELD = 4  # committed, and the hold sweeper asked to act only on held decisions
    OTHER_COUNTERS = 5  # it consumed from none of the counters the refund's limits name


class AdjustStatus(enum.IntEnum):
    """What node/store/lua/adjust.lua answers."""

    APPLIED = 1
    REPLAYED = 2  # the same adjustment was already applied; this is its first answer
    REQUEST_ID_REUSED = 3  # the request_id was used for something else
    EXPIRED = 4  # the quota is over (expires_at passed)


class Refunded(msgspec.Struct, array_like=True, frozen=True, tag="refunded"):
    status: RefundStatus
    given: list[tuple[int, int]]  # per limit: count, amount (minor units)


class Committed(msgspec.Struct, array_like=True, frozen=True, tag="committed"):
    committed: bool


class Undone(msgspec.Struct, array_like=True, frozen=True, tag="undone"):
    counters: int  # counters given back to


class Adjusted(msgspec.Struct, array_like=True, frozen=True, tag="adjusted"):
    """A quota adjustment."""

    status: AdjustStatus
    row: LimitRow | None = None  # the quota after it (ok, retry and delay unused)


class LeaseStatus(enum.IntEnum):
    """What a renewal or release answers (node/store/lua/concurrency.lua's `held`)."""

    NOT_HELD = 0  # expired, released or never granted: nothing changed
    RENEWED = 1
    RELEASED = 2


class Leased(msgspec.Struct, array_like=True, frozen=True, tag="leased"):
    """A lease renewed or released; `at_ms` is the node's Redis clock when it was."""

    status: LeaseStatus
    at_ms: int
    ttl_ms: int = 0  # renewed: it expires ttl_ms after at_ms


class Moved(msgspec.Struct, array_like=True, frozen=True, tag="moved"):
    """The node does not own the key under its topology of this epoch."""

    epoch: int


class Expired(msgspec.Struct, array_like=True, frozen=True, tag="expired"):
    """Not applied: the deadline passed first (send again), no replica held it, or the
    key is moving here and its previous owner could not hand it over (`unavailable`:
    why; that owner's Redis failing over, say). Only this op is affected."""

    unreplicated: bool = False
    unavailable: str = ""


class Failed(msgspec.Struct, array_like=True, frozen=True, tag="error"):
    """A bad op or a script error. `refused`: the shard's Redis refused to write (full
    under noeviction, or unable to persist), before the op changed anything."""

    detail: str
    refused: bool = False


class Reused(msgspec.Struct, array_like=True, frozen=True, tag="reused"):
    """Not applied: the check's request_id already names a different request (same key
    and scope, other fingerprint). Nothing was consumed."""


Result = (
    Checked | Reused | Refunded | Committed | Undone | Adjusted | Leased | Moved | Expired | Failed
)


class BatchReply(msgspec.Struct, array_like=True, frozen=True):
    epoch: int
    node: str
    live: int  # the node's liveness port (node/health/liveness.py)
    results: list[Result]


_batch_decoder = msgspec.msgpack.Decoder(Batch)
_reply_decoder = msgspec.msgpack.Decoder(BatchReply)


def encode(message: Batch | BatchReply) -> bytes:
    return encoder.encode(message)


def decode_batch(data: bytes) -> Batch:
    """Raises msgspec.ValidationError / msgspec.DecodeError."""
    return decoded(_batch_decoder, data)


def decode_reply(data: bytes) -> BatchReply:
    """Raises msgspec.ValidationError / msgspec.DecodeError."""
    return decoded(_reply_decoder, data)
