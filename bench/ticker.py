"""A periodic kernel timer (Linux timerfd) read by the event loop: sub-millisecond ticks.

Event-loop timers have millisecond granularity (libuv, and selectors' epoll timeout),
so an open-loop generator that sleeps until each send would add up to ~1 ms of its own
slack to every latency. A timerfd armed with an absolute CLOCK_MONOTONIC start and a
fixed interval becomes readable at each tick, and reading it returns how many ticks
have passed, so a busy moment never loses a tick either.

`time.monotonic()` is CLOCK_MONOTONIC on Linux: tick i is due at `start + i * interval`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import time
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
