"""A node batch once placed: what is left to run in Redis, and the results so far."""

from __future__ import annotations

from cluster import wire
from node.batch.ops import Op
from node.topology.ownership import Ownership

__all__ = ["PreparedBatch"]


class PreparedBatch:
    """A batch checked against this node's topology: what is left to run in Redis."""

    __slots__ = (
        "deadline_ms",
        "epoch",
        "failovers",
        "importing",
        "imports",
        "moved_on",
        "ownership",
        "results",
        "runnable",
        "slots",
    )

    def __init__(
        self, deadline_ms: int, size: int, ownership: Ownership | None, failovers: int
    ) -> None:
        self.deadline_ms = deadline_ms
        self.failovers = failovers  # the node's count of followed promotions when it began
        self.ownership = ownership  # what the ops were placed by (imports come from it)
        self.epoch = ownership.epoch if ownership is not None else 0
        self.results: list[wire.Result] = [wire.Expired()] * size
        self.runnable: list[Op] = []
        self.slots: list[int] = []
        self.imports: dict[str, list[str]] | None = None  # moving keys, by previous owner
        self.importing: dict[int, str] | None = None  # runnable place -> its previous owner
        self.moved_on = 0  # the shard's newer epoch, when its Redis refused some op
