"""Taking back what a late answer consumed.

An answer to a batch the router gave up on (so its checks were answered degraded) may
come after all: a node stopped between finishing the batch and answering it. Whatever
those checks consumed is taken back, so that a degraded answer consumed nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import msgspec

from cluster import wire
from router.channel.background import Background
from router.channel.watchdog import RECOVERY_PROBE_S
from router.errors import NodeUnavailable

log = logging.getLogger("shardlimit.dispatch")

LATE_UNDO_PATIENCE_S = 600.0  # how long a late check is offered back to its node

Submit = Callable[[wire.Op], asyncio.Future[wire.Result]]


class LateUndo:
    """Sends undo ops for the checks of late answers; counts them (for /metrics)."""

    def __init__(self, node_id: str, submit: Submit, background: Background) -> None:
        self.node_id = node_id
        self.submit = submit  # queues an op for the node
        self.background = background
        self.undone = 0  # checks of late answers taken back
        self.failures = 0  # late checks that could not be taken back

    def late_reply(self, ops: list[wire.Op], reply: wire.Reply) -> None:
        """The channel's late reply to the batch of `ops`."""
        if reply.status == 200 and reply.reply is not None:
            self.take_back_consumed(ops, reply.reply)
        else:
            log.error("node %s: late answer %d: %s", self.node_id, reply.status, reply.detail)

    def late_answer(self, ops: list[wire.Op], status: int, raw: bytes) -> None:
        """A late answer as the HTTP batch endpoint gives it."""
        try:
            reply = wire.decode_reply(raw) if status == 200 else None
        except (msgspec.ValidationError, msgspec.DecodeError):
            reply = None
        if reply is None:
            log.error("node %s: unreadable late answer (HTTP %d)", self.node_id, status)
            return
        self.take_back_consumed(ops, reply)

    def take_back_consumed(self, ops: list[wire.Op], reply: wire.BatchReply) -> None:
        if len(reply.results) != len(ops):
            log.error("node %s: late answer with a different number of results", self.node_id)
            return
        for op, result in zip(ops, reply.results, strict=True):
            if isinstance(result, wire.Checked) and result.undo is not None:
                undo = msgspec.structs.replace(op, kind="undo", undo=result.undo)
                self.background.spawn(self._take_back(undo))

    async def _take_back(self, undo: wire.Op) -> None:
        """Send an undo op until the node takes it (it has just come back: it may still
        be marked down for a moment)."""
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + LATE_UNDO_PATIENCE_S
        while True:
            try:
                result = await self.submit(undo)
            except NodeUnavailable as exc:
                result, error = None, str(exc)
            else:
                error = f"answered {result!r}"
            if isinstance(result, wire.Undone):
                self.undone += 1
                return
            if loop.time() > give_up_at:
                # Not taken back: the one case where a degraded answer did consume.
                self.failures += 1
                log.error("node %s: a late check could not be taken back: %s", self.node_id, error)
                return
            await asyncio.sleep(RECOVERY_PROBE_S)  # retry cadence while the node is down
