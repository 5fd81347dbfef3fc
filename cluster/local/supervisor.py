"""Supervision of a local cluster's children: one that exits is started again, after a
backoff that doubles from `FIRST_DELAY_S` to `MAX_DELAY_S` while it keeps exiting and
starts over once it has stayed up `STABLE_AFTER_S`. A child that never stays up is
retried at the longest delay for as long as the supervisor runs.

`tick()` does one round (which `shardlimit up` calls from its main loop); `run_in_thread`
calls it from a thread of its own. Children restarted there get PR_SET_PDEATHSIG from
that thread (cluster/local/procs.py): the thread must outlive them, so `close()` comes
after the children are stopped, and `halt()` (no more restarts) before.

Counters survive a restart because they live in Redis, which replays its AOF.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cluster.local.procs import ChildProcess

__all__ = ["FIRST_DELAY_S", "MAX_DELAY_S", "STABLE_AFTER_S", "Restart", "Supervisor", "Watched"]

FIRST_DELAY_S = 0.5
MAX_DELAY_S = 10.0
STABLE_AFTER_S = 30.0
TICK_S = 0.1

log = logging.getLogger("shardlimit.supervisor")


def exit_status(returncode: int | None) -> str:
    """`exited with 3`, or `was killed by SIGKILL` for a negative (signal) code."""
    if returncode is not None and returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            pass
    return f"exited with {returncode}"


@dataclass(frozen=True)
class Restart:
    """What one restart is about to do, for one log line."""

    name: str
    returncode: int | None
    delay: float
    attempt: int  # restarts in a row without staying up STABLE_AFTER_S
    at_max: bool  # the delay no longer grows: the child keeps exiting
    log: Path | None

    @property
    def message(self) -> str:
        where = f"; see {self.log}" if self.log is not None else ""
        if self.at_max:
            return (
                f"{self.name} {exit_status(self.returncode)} and keeps exiting: restarting "
                f"it every {self.delay:g} s until it stays up (restart {self.attempt}){where}"
            )
        return (
            f"{self.name} {exit_status(self.returncode)}: restarting it in {self.delay:g} s "
            f"(restart {self.attempt}){where}"
        )


@dataclass
class Watched:
    """One supervised child; `restart` starts it again without waiting for it to be
    ready (default: the same command line, `child.spawn`)."""

    child: ChildProcess
    restart: Callable[[], None] | None = None
    restarts_in_row: int = 0
    due: float | None = None  # when a restart is scheduled
    up_since: float = 0.0

    def start_again(self) -> None:
        (self.restart or self.child.spawn)()


def log_restart(restart: Restart) -> None:
    log.warning(restart.message)


@dataclass
class Supervisor:
    watched: Sequence[Watched]
    report: Callable[[Restart], None] = log_restart
    first_delay: float = FIRST_DELAY_S
    max_delay: float = MAX_DELAY_S
    stable_after: float = STABLE_AFTER_S
    clock: Callable[[], float] = time.monotonic
    _halted: bool = field(default=False, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _done: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        now = self.clock()
        for watched in self.watched:
            watched.up_since = now

    def delay(self, restarts_in_row: int) -> float:
        """The wait before the (restarts_in_row + 1)-th restart in a row."""
        return float(min(self.max_delay, self.first_delay * 2**restarts_in_row))

    def tick(self) -> None:
        """Notice exited children and start those whose delay is over."""
        with self._lock:
            if self._halted:
                return
            for watched in self.watched:
                self._tick(watched, self.clock())

    def _tick(self, watched: Watched, now: float) -> None:
        child = watched.child
        if watched.due is None:
            if child.alive:
                if watched.restarts_in_row and now - watched.up_since >= self.stable_after:
                    watched.restarts_in_row = 0
                return
            delay = self.delay(watched.restarts_in_row)
            watched.restarts_in_row += 1
            watched.due = now + delay
            at_max = delay >= self.max_delay
            attempt = watched.restarts_in_row
            self.report(Restart(child.name, child.returncode, delay, attempt, at_max, child.log))
        elif now >= watched.due:
            watched.due = None
            watched.up_since = now
            try:
                watched.start_again()
            except Exception as exc:  # one child's failure must not end the supervision
                # Not started: the next tick sees it down and schedules the next attempt.
                log.error("%s could not be started again: %s", child.name, exc)

    def halt(self) -> None:
        """No restart from now on (one under way completes first): before a stop."""
        with self._lock:
            self._halted = True

    def run_in_thread(self) -> None:
        def loop() -> None:
            while not self._done.wait(TICK_S):
                self.tick()

        self._thread = threading.Thread(target=loop, name="supervisor", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """End the thread: only once the children it may have restarted are stopped."""
        self.halt()
        self._done.set()
        if self._thread is not None:
            self._thread.join()
