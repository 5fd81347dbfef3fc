"""The router↔node batch protocol: one typed definition both sides import.

A batch is one HTTP request `POST BATCH_PATH` whose body is a msgpack-encoded `Batch`
(positional arrays, no field names on the wire). `deadline_ms` is a Unix time in ms on
the router's clock. The node applies no op after it: it answers `Expired` for a batch
that reached it late (also one that waited in its socket buffer while the process was
stopped), the batch script refuses to run when Redis' clock is past it, and a batch
whose results are ready only after it is taken back before the node answers `Expired`.
The router gives up on a batch only at the deadline + its margin, so an answer it gave
up on never consumed anything (while the router's clock is ahead by less than that).

The answer is a `BatchReply`: one result per op, in order, each a tagged `Result`.

The hot path does not use HTTP: every node also listens on a *channel* port (announced
as `channel` in its `/healthz` answer) for one long-lived, multiplexed connection per
router. Each frame is a 4-byte big-endian length and a msgpack body (`ChannelIn` from
the router, `ChannelOut` from the node). The router's first frame is a `Hello` with
the cluster token; the node answers `Welcome` (or `Refused`, then closes). Then every
`Request` carries an id of the router's choosing, a deadline (as `Batch` above) and
its ops; its `Reply` carries the same id, and replies may come in any order. A reply's
`status` is what the HTTP batch endpoint would have answered (200 with `reply`, else
`detail`: 503 when the node's Redis is unavailable). The channel speaks TLS (and
mutual TLS) exactly when the node's HTTP listener does.

The control messages (JSON bodies of the node's control-plane endpoints) live in
cluster/wire/control.py and are re-exported here: `wire.ExportKeys` as before.
"""

from __future__ import annotations

import enum
import struct
from typing import Annotated, Any, Final, TypeVar

import msgspec

from cluster.wire.control import (
    MAX_EXPORT_KEYS,
    ClockOffset,
    Control,
    Decision,
    DecisionsHandover,
    Entries,
    ExportKeys,
    Holds,
    ImportKeys,
    Lease,
    MigrateStep,
    MigrationCleanup,
    RulesDocument,
)

__all__ = [
    "BATCH_PATH",
    "CONTENT_TYPE",
    "DECISIONS_ADOPT_PATH",
    "DECISIONS_HANDOVER_PATH",
    "DECISION_PATH",
    "EPOCH_STATS_PATH",
    "EXPORT_PATH",
    "FRAME_HEADER",
    "HEALTH_PATH",
    "HOLDS_ADOPT_PATH",
    "HOLDS_SETTLE_PATH",
    "IMPORT_PATH",
    "LANDED_PATH",
    "LEASE_PATH",
    "MAX_EXPORT_KEYS",
    "MAX_FRAME_BYTES",
    "METRICS_PATH",
    "MIGRATE_PATH",
    "MIGRATION_CLEANUP_PATH",
    "READY_PATH",
    "RULES_PATH",
    "STATS_PATH",
    "TEST_CLOCK_PATH",
    "TOPOLOGY_PATH",
    "AdjustStatus",
    "Adjusted",
    "Batch",
    "BatchReply",
    "ChannelIn",
    "ChannelOut",
    "Checked",
    "ClockOffset",
    "Committed",
    "Control",
    "Decision",
    "DecisionsHandover",
    "Entries",
    "Expired",
    "ExportKeys",
    "Failed",
    "FrameBuffer",
    "Hello",
    "Holds",
    "ImportKeys",
    "Lease",
    "LeaseStatus",
    "Leased",
    "LimitRow",
    "MigrateStep",
    "MigrationCleanup",
    "Moved",
    "Op",
    "OpKind",
    "RefundStatus",
    "Refunded",
    "Refused",
    "Reply",
    "Request",
    "Result",
    "Reused",
    "RulesDocument",
    "Undone",
    "Welcome",
    "decode_batch",
    "decode_channel_in",
    "decode_channel_out",
    "decode_reply",
    "encode",
    "frame",
]

BATCH_PATH: Final = "/node/v1/batch"
DECISION_PATH: Final = "/node/v1/decision"  # an all-or-nothing batch's decision record
DECISIONS_HANDOVER_PATH: Final = "/node/v1/decisions/handover"  # a leaving coordinator's
DECISIONS_ADOPT_PATH: Final = "/node/v1/decisions/adopt"  # ... records, to its successor
# Control endpoints (JSON bodies): topology, migration, the topology-change lease, stats.
TOPOLOGY_PATH: Final = "/node/v1/topology"  # PUT: adopt a topology; GET: the node's
STATS_PATH: Final = "/node/v1/stats"  # epoch, liveness port, key counts
# The same, brief: epoch, liveness port, cluster id and rules version, without reading
# Redis' INFO (the routers' epoch poll, twice a second). A node that predates it answers
# the whole stats, which hold the same fields.
EPOCH_STATS_PATH: Final = f"{STATS_PATH}?brief=1"
EXPORT_PATH: Final = "/node/v1/export"  # a migration source hands out moving keys
IMPORT_PATH: Final = "/node/v1/import"  # a target takes keys in
LANDED_PATH: Final = "/node/v1/landed"  # which MIGRATEd keys a target holds (and a replica)
HOLDS_SETTLE_PATH: Final = "/node/v1/holds/settle"  # settle holds whose key moved here
HOLDS_ADOPT_PATH: Final = "/node/v1/holds/adopt"  # a source hands over holds of moved keys
MIGRATE_PATH: Final = "/node/v1/migrate"  # one copy step of a migration
MIGRATION_CLEANUP_PATH: Final = "/node/v1/migration/cleanup"  # drop migration markers
LEASE_PATH: Final = "/node/v1/lease"  # acquire / renew / release a change lease
RULES_PATH: Final = "/node/v1/rules"  # GET / PUT the cluster's versioned rules document
TEST_CLOCK_PATH: Final = "/node/v1/test/clock"  # test mode only: offset the scripts' clock
HEALTH_PATH: Final = "/healthz"  # the node process answers
READY_PATH: Final = "/readyz"  # the node and its Redis answer
METRICS_PATH: Final = "/metrics"  # Prometheus exposition, no token (no label holds a key)
CONTENT_TYPE: Final = "application/msgpack"

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


class RefundStatus(enum.IntEnum):
    """What node/store/lua/refund.lua answers."""

    UNKNOWN = 0  # no decision with this key, rule and request_id
    REFUNDED = 1
    ALREADY_REFUNDED = 2
    NOTHING_CONSUMED = 3
    NOT_HELD = 4  # committed, and the hold sweeper asked to act only on held decisions


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
    """Not applied: the deadline passed first (send again), or no replica held it."""

    unreplicated: bool = False


class Failed(msgspec.Struct, array_like=True, frozen=True, tag="error"):
    """A bad op or a script error."""

    detail: str


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


_encoder = msgspec.msgpack.Encoder()
_Message = TypeVar("_Message")
# What a msgspec decoder raises for bytes that are no message: msgspec before 0.23 lets a
# string's bad UTF-8 out as UnicodeDecodeError rather than as DecodeError.
DECODE_ERRORS: Final = (msgspec.DecodeError, UnicodeDecodeError)
NOT_UTF8: Final = "a string is not UTF-8"
_batch_decoder = msgspec.msgpack.Decoder(Batch)
_reply_decoder = msgspec.msgpack.Decoder(BatchReply)


def encode(message: Batch | BatchReply) -> bytes:
    return _encoder.encode(message)


def _decoded(decoder: msgspec.msgpack.Decoder[_Message], body: bytes | memoryview) -> _Message:
    """Bad UTF-8 in a string is one DecodeError, worded the same whichever msgspec raised
    it (before 0.23 a UnicodeDecodeError, from 0.23 a DecodeError of its own wording)."""
    try:
        return decoder.decode(body)
    except UnicodeDecodeError as exc:
        raise msgspec.DecodeError(f"{NOT_UTF8}: {exc}") from None
    except msgspec.DecodeError as exc:
        if "UTF-8" in str(exc):
            raise msgspec.DecodeError(f"{NOT_UTF8}: {exc}") from None
        raise


def decode_batch(data: bytes) -> Batch:
    """Raises msgspec.ValidationError / msgspec.DecodeError."""
    return _decoded(_batch_decoder, data)


def decode_reply(data: bytes) -> BatchReply:
    """Raises msgspec.ValidationError / msgspec.DecodeError."""
    return _decoded(_reply_decoder, data)


# ----------------------------------------------------------------- the hot-path channel

FRAME_HEADER: Final = struct.Struct(">I")  # the length of the msgpack body that follows
MAX_FRAME_BYTES: Final = 16 * 1024 * 1024


class Hello(msgspec.Struct, array_like=True, frozen=True, tag="hello"):
    """The router's first frame: the cluster token (None when the cluster has none)."""

    token: str | None


class Request(msgspec.Struct, array_like=True, frozen=True, tag="batch"):
    """A batch on the channel: `Batch` with the router's id for it.

    `layout`: the `Topology.layout_id` by which the router placed every op on this node
    (each key's owner), 0 when not by one. A node whose topology has that same layout and
    is in no migration serves every op without placing it again: it would place them the
    same way. Otherwise it places each op (`Moved`, imports)."""

    id: int
    deadline_ms: Annotated[int, msgspec.Meta(gt=0)]
    ops: list[Op]
    layout: NonNegative = 0


class Welcome(msgspec.Struct, array_like=True, frozen=True, tag="welcome"):
    node: str
    epoch: int
    live: int  # the node's liveness port


class Refused(msgspec.Struct, array_like=True, frozen=True, tag="refused"):
    """Not welcome (a wrong token, a first frame that is no `Hello`): the node closes."""

    detail: str


class Reply(msgspec.Struct, array_like=True, frozen=True, tag="reply"):
    id: int
    status: int  # 200: `reply` holds the answer; else `detail` says why not
    reply: BatchReply | None = None
    detail: str = ""


ChannelIn = Hello | Request
ChannelOut = Welcome | Refused | Reply

_in_decoder: msgspec.msgpack.Decoder[ChannelIn] = msgspec.msgpack.Decoder(ChannelIn)
_out_decoder: msgspec.msgpack.Decoder[ChannelOut] = msgspec.msgpack.Decoder(ChannelOut)


def frame(message: ChannelIn | ChannelOut) -> bytes:
    """One frame: the length header, then the msgpack body."""
    buffer = bytearray(FRAME_HEADER.size)
    _encoder.encode_into(message, buffer, FRAME_HEADER.size)
    FRAME_HEADER.pack_into(buffer, 0, len(buffer) - FRAME_HEADER.size)
    return bytes(buffer)


def decode_channel_in(body: bytes | memoryview) -> ChannelIn:
    """Raises msgspec.ValidationError / msgspec.DecodeError."""
    return _decoded(_in_decoder, body)


def decode_channel_out(body: bytes | memoryview) -> ChannelOut:
    """Raises msgspec.ValidationError / msgspec.DecodeError."""
    return _decoded(_out_decoder, body)


class FrameBuffer:
    """Bytes from a stream in, complete frame bodies out."""

    __slots__ = ("_data",)

    def __init__(self) -> None:
        self._data = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The bodies of the frames completed by `data`, in order. Raises ValueError
        for a frame longer than MAX_FRAME_BYTES (the stream cannot be trusted after)."""
        buffer = self._data
        buffer += data
        bodies: list[bytes] = []
        at, size = 0, len(buffer)
        while size - at >= 4:
            (length,) = FRAME_HEADER.unpack_from(buffer, at)
            if length > MAX_FRAME_BYTES:
                raise ValueError(f"frame of {length} bytes (at most {MAX_FRAME_BYTES})")
            end = at + 4 + length
            if end > size:
                break
            bodies.append(bytes(buffer[at + 4 : end]))
            at = end
        del buffer[:at]
        return bodies
