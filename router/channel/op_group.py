"""Many ops bound for one node, answered through one future (a client batch's share of a
node): no future, done callback or loop wake-up per op, and no object per op either: a
node's queue holds runs of ops (router/channel/node_queue.py), each answered with one call."""

from __future__ import annotations

import asyncio
from typing import cast

from cluster import wire

Outcome = wire.Result | BaseException


class OpGroup:
    """Outcomes of `size` ops, in order; `future` completes once every op has one."""

    __slots__ = ("future", "left", "outcomes")

    def __init__(self, size: int) -> None:
        self.future: asyncio.Future[list[Outcome]] = asyncio.get_running_loop().create_future()
        self.outcomes: list[Outcome | None] = [None] * size
        self.left = size
        if not size:
            self.future.set_result([])

    def settle(self, index: int, outcome: Outcome) -> None:
        if self.outcomes[index] is not None:
            return
        self.outcomes[index] = outcome
        self.left -= 1
        self._complete()

    def settle_run(self, start: int, outcomes: list[wire.Result]) -> None:
        """Outcomes of the ops from `start` on, one per op (settle() for each)."""
        end = start + len(outcomes)
        mine = self.outcomes
        if mine[start:end].count(None) == len(outcomes):  # none settled yet: the rule
            mine[start:end] = outcomes
            self.left -= len(outcomes)
            self._complete()
        else:
            for index, outcome in enumerate(outcomes, start):
                self.settle(index, outcome)

    def _complete(self) -> None:
        if not self.left and not self.future.done():
            self.future.set_result(cast(list[Outcome], self.outcomes))
