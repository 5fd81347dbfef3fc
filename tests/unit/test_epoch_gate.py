"""EpochGate: a new epoch waits for work of older epochs, and only for that."""

from __future__ import annotations

import asyncio

from node.topology.epoch_gate import EpochGate


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_drained_waits_for_an_older_epoch_held_and_ends_on_leave() -> None:
    gate = EpochGate()
    gate.enter(3)
    waiting = asyncio.create_task(gate.drained(4))
    await _settle()
    assert not waiting.done()
    gate.leave(3)
    await asyncio.wait_for(waiting, 1.0)
    assert gate.in_flight(3) == 0


async def test_drained_waits_for_every_hold_of_the_older_epoch() -> None:
    gate = EpochGate()
    first, second = gate.hold(2), gate.hold(2)
    await first.__aenter__()
    await second.__aenter__()
    assert gate.in_flight(2) == 2
    waiting = asyncio.create_task(gate.drained(3))
    await first.__aexit__(None, None, None)
    await _settle()
    assert not waiting.done()
    await second.__aexit__(None, None, None)
    await asyncio.wait_for(waiting, 1.0)


async def test_work_of_the_new_epoch_or_newer_does_not_block_it() -> None:
    gate = EpochGate()
    gate.enter(4)
    gate.enter(5)
    async with gate.hold(4):
        await asyncio.wait_for(gate.drained(4), 1.0)
    assert gate.in_flight(4) == 1 and gate.in_flight(5) == 1


async def test_waiters_wake_by_their_own_epoch() -> None:
    gate = EpochGate()
    gate.enter(1)
    gate.enter(2)
    for_two = asyncio.create_task(gate.drained(2))
    for_three = asyncio.create_task(gate.drained(3))
    await _settle()
    gate.leave(1)
    await asyncio.wait_for(for_two, 1.0)
    await _settle()
    assert not for_three.done()
    gate.leave(2)
    await asyncio.wait_for(for_three, 1.0)


async def test_a_cancelled_waiter_is_forgotten() -> None:
    gate = EpochGate()
    gate.enter(1)
    waiting = asyncio.create_task(gate.drained(2))
    await _settle()
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    gate.leave(1)
    assert gate.in_flight(1) == 0
    await asyncio.wait_for(gate.drained(2), 1.0)
