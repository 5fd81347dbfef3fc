"""node.migration.copy_step.Budget: the share of the source Redis' time a copy leaves to
live traffic, held on one clock whatever the event loop's timers round to, and the
default share that the router hands every source."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from node.migration.copy_step import MIN_PAUSE_S, Budget
from node.migration.redis_time import READ_EVERY_S, RedisTime
from node.store.redispy_pipe import Sender
from router.config import RouterConfig


class MillisecondTimers:
    """A clock whose sleeps end on whole milliseconds, as uvloop's timers do (a delay is
    rounded to the nearest millisecond: under half of one, no sleep at all)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.slept.append(delay)
        self.now += round(delay * 1000) / 1000

    def run(self, seconds: float) -> None:
        """A copy call that kept Redis busy this long."""
        self.now += seconds


async def copy_calls(budget: Budget, timers: MillisecondTimers, calls: int, each_s: float) -> float:
    began = timers.now
    for _ in range(calls):
        timers.run(each_s)
        await budget.after(each_s, moved=100)
    return timers.now - began


@pytest.mark.parametrize("busy_pct", [25, 50, 80, 90])
async def test_the_copy_takes_its_share_of_redis_when_each_pause_is_under_a_millisecond(
    busy_pct: int,
) -> None:
    timers = MillisecondTimers()
    budget = Budget(busy_pct=busy_pct, clock=timers.clock, sleep=timers.sleep)
    # 400 MIGRATE calls of 0.8 ms: at 80 % each owes 0.2 ms, which a timer alone never waits.
    elapsed = await copy_calls(budget, timers, 400, 0.0008)
    busy = 400 * 0.0008
    assert busy / elapsed == pytest.approx(busy_pct / 100, abs=0.005)
    assert all(delay >= MIN_PAUSE_S for delay in timers.slept)
    assert budget.moved == 40_000
    assert budget.paused_s == pytest.approx(elapsed - busy)


async def test_at_a_full_share_the_copy_never_waits() -> None:
    timers = MillisecondTimers()
    budget = Budget(busy_pct=100, clock=timers.clock, sleep=timers.sleep)
    assert await copy_calls(budget, timers, 50, 0.0008) == pytest.approx(50 * 0.0008)
    assert timers.slept == [] and budget.paused_s == 0.0


async def test_the_finder_and_the_mover_wait_for_the_same_clock() -> None:
    now = [1000.004]
    waiting: list[tuple[float, asyncio.Future[None]]] = []

    async def sleep(delay: float) -> None:  # until the test moves the clock on
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting.append((delay, woken))
        await woken

    budget = Budget(busy_pct=50, clock=lambda: now[0], sleep=sleep)
    mover = asyncio.ensure_future(budget.after(0.004, moved=100))  # a MIGRATE from 1000.000
    await asyncio.sleep(0)
    finder = asyncio.ensure_future(budget.after(0.0))  # a SCAN answered at the same moment
    await asyncio.sleep(0)
    # The MIGRATE's share ends 8 ms after it began (less the millisecond credited to a
    # copy's first call): both wait for that.
    assert budget.free_at == pytest.approx(1000.007)
    assert [delay for delay, _ in waiting] == pytest.approx([0.003, 0.003])
    now[0] = 1000.007
    for _, woken in waiting:
        woken.set_result(None)
    await asyncio.gather(mover, finder)
    assert budget.paused_s == pytest.approx(0.003)  # the waiting counted once


@pytest.mark.parametrize("first", ["migrate", "scan"])
async def test_a_scan_waiting_behind_a_migrate_is_not_counted_twice(first: str) -> None:
    """The finder's SCAN, sent while the mover's MIGRATE runs, waits behind it in Redis:
    both calls span the MIGRATE's time, which was Redis' once (whichever is counted first)."""
    timers = MillisecondTimers()
    budget = Budget(busy_pct=80, clock=timers.clock, sleep=timers.sleep)
    began = timers.now
    for _ in range(200):
        sent = timers.now
        timers.run(0.001)  # the MIGRATE from `sent` for 0.8 ms, the SCAN from 0.2 ms to 1.0
        calls = [(0.0008, 100, sent + 0.0008), (0.0008, 0, sent + 0.001)]
        for blocked_s, moved, ended in calls if first == "migrate" else calls[::-1]:
            await budget.after(blocked_s, moved, ended)
    busy = 200 * 0.001
    assert busy / (timers.now - began) == pytest.approx(0.8, abs=0.005)
    assert budget.paused_s == pytest.approx(timers.now - began - busy)


class CountedTime(RedisTime):
    """The copy commands' time as a Redis would count it, kept by the test."""

    def __init__(self, timers: MillisecondTimers) -> None:
        super().__init__(cast(Sender, None), clock=timers.clock)
        self.seconds = 0.0

    async def total(self) -> float:
        return self.seconds


@pytest.mark.parametrize("busy_pct", [25, 50, 80])
async def test_counted_by_redis_the_copy_takes_its_share_of_what_redis_counts(
    busy_pct: int,
) -> None:
    """Each call takes 1 ms as the node times it, of which Redis counts 0.4 ms (the rest is
    the round trip and the node's own work): the budget holds the 0.4 ms to its share."""
    timers = MillisecondTimers()
    counted = CountedTime(timers)
    budget = Budget(busy_pct=busy_pct, clock=timers.clock, sleep=timers.sleep, redis_time=counted)
    assert budget.counted_by_redis
    began = timers.now
    for _ in range(500):
        timers.run(0.001)
        counted.seconds += 0.0004
        await budget.after(0.001, moved=100)
    elapsed = timers.now - began
    share = 500 * 0.0004 / elapsed
    # Read every READ_EVERY_S, the budget lags by at most one reading's worth.
    if busy_pct < 40:
        assert share == pytest.approx(busy_pct / 100, abs=0.01)
    else:  # Redis' share is 40 % with no pause at all
        assert share == pytest.approx(0.4) and budget.paused_s == 0.0
    assert budget.moved == 50_000


async def test_counts_that_start_over_are_not_charged() -> None:
    """A Redis whose counts went back (a restart) or leapt (another Redis after a
    failover) gives no reading: the next one starts from there."""
    timers = MillisecondTimers()
    counted = CountedTime(timers)
    assert await counted.used() is None  # the first reading only sets where counts begin
    for seconds, expected in [(0.002, 0.002), (0.001, None), (9.0, None), (9.003, 0.003)]:
        timers.run(READ_EVERY_S * 1.1)
        counted.seconds = seconds
        reading = await counted.used()
        assert (reading and round(reading[0], 6)) == expected
    timers.run(READ_EVERY_S / 2)
    assert await counted.used() is None  # not due yet


async def test_a_rate_holds_the_copy_to_its_keys_per_second() -> None:
    timers = MillisecondTimers()
    budget = Budget(busy_pct=100, rate=1000, clock=timers.clock, sleep=timers.sleep)
    # 500 keys in calls of 100 at 1,000 keys/s: half a second, however short the calls.
    elapsed = await copy_calls(budget, timers, 5, 0.001)
    assert elapsed == pytest.approx(0.5)
    assert budget.paused_s == pytest.approx(elapsed - 5 * 0.001)
    assert budget.moved == 500


def test_the_routers_default_share_is_the_nodes() -> None:
    assert RouterConfig().reshard_busy_pct == Budget().busy_pct == 80
