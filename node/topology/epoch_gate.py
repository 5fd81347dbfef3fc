"""Work in flight per topology epoch, so a new topology is acknowledged only once every
batch, hold settle and copy-step move that began under an older epoch reached Redis.

Work counts itself with `async with gate.hold(epoch)`, or with `enter(epoch)` and
`leave(epoch)` where no await may happen (the channel's callback path). `leave` is
synchronous and cheap: waiters are futures, and they are looked at only when an epoch's
count drops to zero, which is the only moment a waiter's wait can end.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

__all__ = ["EpochGate"]


class EpochGate:
    __slots__ = ("_counts", "_waiters")

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}  # epoch -> work in flight (no zero entries)
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []  # (below epoch, woken)

    def enter(self, epoch: int) -> None:
        counts = self._counts
        counts[epoch] = counts.get(epoch, 0) + 1

    def leave(self, epoch: int) -> None:
        counts = self._counts
        left = counts[epoch] - 1
        if left:
            counts[epoch] = left
            return
        del counts[epoch]
        if self._waiters:
            self._wake()

    def hold(self, epoch: int) -> _Hold:
        """`async with gate.hold(epoch):` counts the block as work of `epoch`."""
        return _Hold(self, epoch)

    def in_flight(self, epoch: int) -> int:
        return self._counts.get(epoch, 0)

    def _busy_below(self, below_epoch: int) -> bool:
        return any(epoch < below_epoch for epoch in self._counts)

    async def drained(self, below_epoch: int) -> None:
        """Return once no work of an epoch older than `below_epoch` is in flight."""
        if not self._busy_below(below_epoch):
            return
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = (below_epoch, woken)
        self._waiters.append(waiter)
        try:
            await woken
        finally:
            if waiter in self._waiters:  # cancelled before it was woken
                self._waiters.remove(waiter)

    def _wake(self) -> None:
        waiting = []
        for waiter in self._waiters:
            below_epoch, woken = waiter
            if woken.done():
                continue
            if self._busy_below(below_epoch):
                waiting.append(waiter)
            else:
                woken.set_result(None)
        self._waiters = waiting


class _Hold:
    __slots__ = ("_epoch", "_gate")

    def __init__(self, gate: EpochGate, epoch: int) -> None:
        self._gate = gate
        self._epoch = epoch

    async def __aenter__(self) -> None:
        self._gate.enter(self._epoch)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._gate.leave(self._epoch)
