"""Many ops bound for one node, answered through one future (a client batch's share of a
node): no future, done callback or loop wake-up per op."""

from __future__ import annotations

import asyncio
from typing import Protocol

from cluster import wire

Outcome = wire.Result | BaseException


class Sink(Protocol):
    """Where a queued op's outcome goes: its own future, or its slot in an OpGroup."""

    def done(self) -> bool: ...

    def set_result(self, result: wire.Result, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


class OpGroup:
    """Outcomes of `size` ops, in order; `future` completes once every op has one."""

    __slots__ = ("future", "left", "outcomes")

    def __init__(self, size: int) -> None:
        self.future: asyncio.Future[list[Outcome]] = asyncio.get_running_loop().create_future()
        self.outcomes: list[Outcome | None] = [None] * size
        self.left = size
        if not size:
            self.future.set_result([])

    def slot(self, index: int) -> Slot:
        return Slot(self, index)

    def settle(self, index: int, outcome: Outcome) -> None:
        if self.outcomes[index] is not None:
            return
        self.outcomes[index] = outcome
        self.left -= 1
        if not self.left and not self.future.done():
            self.future.set_result([o for o in self.outcomes if o is not None])


class Slot:
    """One op's place in an OpGroup, used where a single op's future would be."""

    __slots__ = ("group", "index")

    def __init__(self, group: OpGroup, index: int) -> None:
        self.group = group
        self.index = index

    def done(self) -> bool:
        return self.group.outcomes[self.index] is not None

    def set_result(self, result: wire.Result, /) -> None:
        self.group.settle(self.index, result)

    def set_exception(self, exception: BaseException, /) -> None:
        self.group.settle(self.index, exception)
