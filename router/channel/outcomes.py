"""A batch's outcome read: the node's results, or NodeUnavailable saying why not.

Every transport failure of a batch is translated here, and what it proves is passed on:
an answer closes the breaker, a 503 marks the node down, a refused or reset connection
has the node probed.
"""

from __future__ import annotations

from collections.abc import Callable

from cluster import wire
from router.channel.breaker import Breaker
from router.channel.liveness import LivenessProbe
from router.channel.watchdog import Watchdog
from router.errors import NodeUnavailable, Reason


def result_failure(result: wire.Result, context: str = "") -> NodeUnavailable:
    """Why a node's result is not the answer its op asks for: its Redis refused to write
    (`refused`: full or unable to persist, nothing consumed), a script error or a result
    of another kind (`error`)."""
    if isinstance(result, wire.Failed):
        reason = Reason.REFUSED if result.refused else Reason.ERROR
        return NodeUnavailable(context + result.detail, reason)
    return NodeUnavailable(f"{context}unexpected {result!r}", Reason.ERROR)


def _ignore(_value: float) -> None:
    pass


class BatchOutcomes:
    """Reads batch outcomes for one node and counts its failures (for /metrics)."""

    def __init__(
        self, node_id: str, breaker: Breaker, liveness: LivenessProbe, watchdog: Watchdog
    ) -> None:
        self.node_id = node_id
        self.breaker = breaker
        self.liveness = liveness
        self.watchdog = watchdog
        self.failures = 0
        self.timeouts = 0
        self.last_error: str | None = None
        # Observer for /metrics (router/metrics.py): answered round trips.
        self.on_round_trip: Callable[[float], None] = _ignore

    def read(
        self, ops: list[wire.Op], started: float, outcome: wire.Reply | BaseException
    ) -> tuple[list[wire.Result], int]:
        """The results (in order) and the node's epoch of a batch of `ops` sent at loop
        time `started`; raises NodeUnavailable."""
        if isinstance(outcome, TimeoutError):
            self.timeouts += 1
            self._note_failure(f"node {self.node_id}: no answer by the deadline")
            raise NodeUnavailable(
                f"node {self.node_id}: timed out (no answer by deadline + margin)",
                Reason.TIMEOUT,
                endpoint_down=self.breaker.is_open,
            ) from outcome
        if isinstance(outcome, OSError):
            reason = f"node {self.node_id}: {type(outcome).__name__} {outcome}"
            self._note_failure(reason)
            self.watchdog.check(reason)
            raise NodeUnavailable(reason) from outcome
        if isinstance(outcome, BaseException):
            raise outcome
        self.on_round_trip(self.liveness.answered(started))
        if outcome.status == 503:
            reason = f"node {self.node_id} answered 503: {outcome.detail}"
            self._note_failure(reason)
            self.watchdog.mark_down(reason)
            raise NodeUnavailable(reason)
        reply = outcome.reply
        if outcome.status != 200 or reply is None or len(reply.results) != len(ops):
            if outcome.status != 200:
                reason = f"node {self.node_id}: answered {outcome.status}: {outcome.detail}"
            else:
                reason = f"node {self.node_id}: answered with a different number of results"
            self._note_failure(reason)
            raise NodeUnavailable(reason, Reason.ERROR)
        self.liveness.learn_port(reply.live)
        self.breaker.success()
        return reply.results, reply.epoch

    def _note_failure(self, reason: str) -> None:
        self.failures += 1
        self.last_error = reason
