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

The modules: `batch` (ops and results), `channel` (its frames), `control` (the JSON
bodies of the node's control-plane endpoints), `paths` (the node's endpoints) and
`codec` (the msgpack encoder they share). Everything is re-exported here, so callers
write `wire.Op`, `wire.ExportKeys`, `wire.BATCH_PATH`.
"""

from __future__ import annotations

from cluster.wire.batch import (
    Adjusted,
    AdjustStatus,
    Batch,
    BatchReply,
    Checked,
    Committed,
    Expired,
    Failed,
    Leased,
    LeaseStatus,
    LimitRow,
    Moved,
    NonNegative,
    Op,
    OpKind,
    Refunded,
    RefundStatus,
    Result,
    Reused,
    Undone,
    decode_batch,
    decode_reply,
    encode,
)
from cluster.wire.channel import (
    FRAME_HEADER,
    MAX_FRAME_BYTES,
    MAX_HELLO_BYTES,
    ChannelIn,
    ChannelOut,
    FrameBuffer,
    Hello,
    Refused,
    Reply,
    Request,
    Welcome,
    decode_channel_in,
    decode_channel_out,
    frame,
)
from cluster.wire.codec import (
    DECODE_ERRORS,
    NOT_UTF8,
)
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
from cluster.wire.paths import (
    BATCH_PATH,
    CONTENT_TYPE,
    DECISION_PATH,
    DECISIONS_ADOPT_PATH,
    DECISIONS_HANDOVER_PATH,
    EPOCH_STATS_PATH,
    EXPORT_PATH,
    HEALTH_PATH,
    HOLDS_ADOPT_PATH,
    HOLDS_SETTLE_PATH,
    IMPORT_PATH,
    LANDED_PATH,
    LEASE_PATH,
    METRICS_PATH,
    MIGRATE_PATH,
    MIGRATION_CLEANUP_PATH,
    READY_PATH,
    RULES_PATH,
    STATS_PATH,
    TEST_CLOCK_PATH,
    TOPOLOGY_PATH,
)

__all__ = [
    "BATCH_PATH",
    "CONTENT_TYPE",
    "DECISIONS_ADOPT_PATH",
    "DECISIONS_HANDOVER_PATH",
    "DECISION_PATH",
    "DECODE_ERRORS",
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
    "MAX_HELLO_BYTES",
    "METRICS_PATH",
    "MIGRATE_PATH",
    "MIGRATION_CLEANUP_PATH",
    "NOT_UTF8",
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
    "NonNegative",
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
