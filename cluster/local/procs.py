"""One child process of the launcher: started, awaited until ready, stopped cleanly,
and for chaos SIGKILLed, SIGSTOPped/SIGCONTed and started again.

Every process that `shardlimit up`, the benchmarks and the chaos tests start is a
`ChildProcess`: PR_SET_PDEATHSIG makes it die with its parent (no orphans), its
stdout and stderr go to a log file, and readiness is a probe polled with a deadline
(from a blocking caller, or from an event loop without blocking it).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import inspect
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

_PR_SET_PDEATHSIG = 1
_POLL_S = 0.02  # polling cadence of every readiness wait (a condition with a deadline)

Probe = Callable[[], bool]


def child_preexec() -> None:
    """Ask Linux to SIGTERM this child when its parent dies (no orphan redis-server)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """One probe: does `url` answer 200 now?"""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - ours
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


async def until(condition: Callable[[], bool | Awaitable[bool]], within: float, what: str) -> None:
    """Poll a condition owned by another process (or by other tasks) until it holds."""
    deadline = time.monotonic() + within
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {within:.0f} s")
        await asyncio.sleep(_POLL_S)


def command_lines() -> Iterator[tuple[int, str]]:
    """(pid, command line) of every process we can see (Linux /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        yield int(entry.name), cmdline


def proc_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat: R, S, T (stopped), Z ..."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?"
    return stat[stat.rindex(")") + 2]


class Started:
    """`with x:` starts x, and stops it on the way out, also when starting failed."""

    def start(self, within: float = 30.0) -> None:
        raise NotImplementedError

    def stop(self, grace: float = 10.0) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


class ChildProcess(Started):
    """A child process: `args` run with `env`, output appended to `log` (else discarded),
    ready once `probe` (or `ready_url` answering 200) holds. Can be started again after
    it exited or was killed: same arguments, same log."""

    def __init__(
        self,
        name: str,
        args: list[str],
        *,
        log: Path | None = None,
        env: dict[str, str] | None = None,
        ready_url: str | None = None,
        probe: Probe | None = None,
    ) -> None:
        self.name = name
        self.args = args
        self.log = log
        self.env = env
        self.ready_url = ready_url
        self.probe = probe or ((lambda: http_ok(ready_url)) if ready_url else (lambda: True))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def spawn(self) -> None:
        """Start the process; do not wait for it (see `wait_ready`)."""
        assert not self.alive, f"{self.name} is running already"
        handle = None
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            handle = self.log.open("ab")
        try:
            # PDEATHSIG fires when the spawning *thread* ends: spawn from a long-lived one.
            self.proc = subprocess.Popen(
                self.args,
                stdout=handle or subprocess.DEVNULL,
                stderr=subprocess.STDOUT if handle else subprocess.DEVNULL,
                env=self.env,
                preexec_fn=child_preexec,
            )
        finally:
            if handle is not None:
                handle.close()  # the child holds its own copy

    def _not_exited(self) -> None:
        if not self.alive:
            code = self.returncode
            raise RuntimeError(f"{self.name} exited with {code} before it was ready{self.tail()}")

    def wait_ready(self, within: float = 30.0) -> None:
        """Block until the probe holds; RuntimeError if the process exits first or time
        runs out."""
        deadline = time.monotonic() + within
        while True:
            self._not_exited()
            if self.probe():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready within {within:.0f} s{self.tail()}")
            time.sleep(_POLL_S)

    async def wait_ready_async(self, within: float = 30.0) -> None:
        """`wait_ready` from an event loop: the probe runs in a thread, the loop goes on."""

        async def ready() -> bool:
            self._not_exited()
            return await asyncio.to_thread(self.probe)

        try:
            await until(ready, within, f"{self.name} ready")
        except TimeoutError as exc:
            raise RuntimeError(f"{exc}{self.tail()}") from exc

    def start(self, within: float = 30.0) -> None:
        self.spawn()
        self.wait_ready(within)

    async def start_async(self, within: float = 30.0) -> None:
        self.spawn()
        await self.wait_ready_async(within)

    def kill(self) -> None:
        """SIGKILL: a crash (no clean-up, no fsync). Returns once the process is gone."""
        assert self.proc is not None and self.alive, f"{self.name} is not running"
        self.proc.kill()
        self.proc.wait()

    def pause(self, within: float = 10.0) -> None:
        """SIGSTOP: a hang. Returns once the kernel reports the process stopped."""
        assert self.alive, f"{self.name} is not running"
        os.kill(self.pid, signal.SIGSTOP)
        deadline = time.monotonic() + within
        while proc_state(self.pid) != "T":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not stopped within {within:.0f} s")
            time.sleep(0.001)  # the kernel delivers SIGSTOP within microseconds

    def resume(self) -> None:
        """SIGCONT: the hang is over."""
        os.kill(self.pid, signal.SIGCONT)

    def terminate(self) -> None:
        """SIGTERM without waiting (after SIGCONT, in case it is stopped)."""
        if self.proc is not None and self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
                self.proc.terminate()

    def wait_stopped(self, grace: float = 10.0, *, insist_s: float | None = None) -> None:
        """Wait for the exit `terminate` asked for, SIGTERM again every `insist_s` seconds
        (None: once is enough); SIGKILL after `grace` seconds."""
        if self.proc is None:
            return
        deadline = time.monotonic() + grace
        while True:
            left = deadline - time.monotonic()
            try:
                self.proc.wait(max(0.0, left if insist_s is None else min(insist_s, left)))
                return
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    break
                self.terminate()
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()

    def stop(self, grace: float = 10.0, *, insist_s: float | None = None) -> None:
        """SIGTERM (a clean shutdown), then SIGKILL if it is not gone after `grace` s."""
        self.terminate()
        self.wait_stopped(grace, insist_s=insist_s)

    def tail(self, chars: int = 3000) -> str:
        """The end of the log, to explain a failure (empty without a log)."""
        if self.log is None or not self.log.exists():
            return ""
        return f" ({self.log}):\n" + self.log.read_text(errors="replace")[-chars:]


def python_module(module: str, *args: str) -> list[str]:
    """argv of `python -m module args` with this interpreter."""
    return [sys.executable, "-m", module, *args]
