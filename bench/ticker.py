"""A periodic kernel timer (Linux timerfd) read by the event loop: sub-millisecond ticks,
and the open-loop schedule of the generators that send on them.

Event-loop timers have millisecond granularity (libuv, and selectors' epoll timeout),
so an open-loop generator that sleeps until each send would add up to ~1 ms of its own
slack to every latency. A timerfd armed with an absolute CLOCK_MONOTONIC start and a
fixed interval becomes readable at each tick, and reading it returns how many ticks
have passed, so a busy moment never loses a tick either.

`time.monotonic()` is CLOCK_MONOTONIC on Linux: tick i is due at `start + i * interval`.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import sys
import time
from collections.abc import Callable
from types import TracebackType

_CLOCK_MONOTONIC = 1
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _timespec(ns: int) -> _Timespec:
    return _Timespec(ns // 1_000_000_000, ns % 1_000_000_000)


def available() -> bool:
    return sys.platform.startswith("linux")


class Ticker:
    """Periodic timerfd: `fd` becomes readable every `interval_ns` from `start_ns`."""

    def __init__(self, interval_ns: int, start_ns: int) -> None:
        self.interval_ns = interval_ns
        self.start_ns = start_ns
        self._libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self.fd: int = self._libc.timerfd_create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        spec = _Itimerspec(_timespec(interval_ns), _timespec(start_ns))
        if self._libc.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None):
            errno = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(errno, "timerfd_settime failed")

    @classmethod
    def starting_in(cls, interval_s: float, delay_s: float = 0.01) -> Ticker:
        return cls(max(1, round(interval_s * 1e9)), time.monotonic_ns() + round(delay_s * 1e9))

    @property
    def start(self) -> float:
        """Tick 0, in `time.monotonic()` seconds."""
        return self.start_ns / 1e9

    @property
    def interval(self) -> float:
        return self.interval_ns / 1e9

    def expirations(self) -> int:
        """Ticks since the last read (0 when the fd was not ready)."""
        try:
            return int.from_bytes(os.read(self.fd, 8), sys.byteorder)
        except BlockingIOError:
            return 0

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Ticker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _never() -> bool:
    return False


async def send_on_schedule(
    rate: float,
    total: int,
    send: Callable[[int, float], None],
    stopped: Callable[[], bool] = _never,
) -> tuple[float, float]:
    """`send(i, due)` for each i below `total` at its due time, `start + i / rate`, whatever
    the answers do (an open loop): on the ticks of a timerfd where there is one, else by
    event-loop sleeps (~1 ms of slack). (start, time of the last send)."""
    if not available():
        return await _send_after_sleeps(rate, total, send, stopped)
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[None] = loop.create_future()
    i = 0
    with Ticker.starting_in(1.0 / rate) as tick:
        start, interval = tick.start, tick.interval

        def on_tick() -> None:
            nonlocal i
            for _ in range(tick.expirations()):
                if i >= total or stopped():
                    break
                send(i, start + i * interval)
                i += 1
            if (i >= total or stopped()) and not finished.done():
                finished.set_result(None)

        loop.add_reader(tick.fd, on_tick)
        try:
            await finished
        finally:
            loop.remove_reader(tick.fd)
    return start, time.monotonic()


async def _send_after_sleeps(
    rate: float, total: int, send: Callable[[int, float], None], stopped: Callable[[], bool]
) -> tuple[float, float]:
    interval = 1.0 / rate
    start = time.monotonic() + 0.01
    i = 0
    while i < total and not stopped():
        now = time.monotonic()
        if start + i * interval > now:
            await asyncio.sleep(start + i * interval - now)
            continue
        while i < total and start + i * interval <= now:
            send(i, start + i * interval)
            i += 1
    return start, time.monotonic()
