"""The router↔node batch protocol: one definition both sides import.

A batch is one HTTP request `POST BATCH_PATH` with a JSON body
`{"deadline_ms": D, "ops": [...]}`. D is a Unix time in milliseconds on the
router's clock. The node applies no op after D: it answers `expired` for a batch
that reached it late (including one that waited in its socket buffer while the
process was stopped), the check script refuses to run when Redis' clock is past
D, and a batch whose results are ready only after D is rolled back before the
node answers `expired`. The router gives up on a batch only at D + its margin,
so an answer it gave up on never consumed anything (as long as the clocks of the
router and the node hosts differ by less than that margin; see the README).

Each op gets one result object in order; its `s` field is a Status.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

__all__ = ["BATCH_PATH", "DEADLINE_FIELD", "HEALTH_PATH", "READY_PATH", "Status"]

BATCH_PATH: Final = "/node/v1/batch"
HEALTH_PATH: Final = "/healthz"  # liveness: answered by the node process itself
READY_PATH: Final = "/readyz"  # readiness: the node and its Redis answer
DEADLINE_FIELD: Final = "deadline_ms"


class Status(StrEnum):
    OK = "ok"
    MOVED = "moved"  # the node does not own the key under its topology (carries "epoch")
    EXPIRED = "expired"  # not applied: the deadline passed first (safe to send again)
    ERROR = "error"  # a bad op or a script error (carries "detail")
