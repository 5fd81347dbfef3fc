"""Where the CPU went during a measurement, per role, from /proc (Linux only).

`CpuWindow` samples every descendant of this process (router, nodes, Redis, wrk, ...)
a few times a second and reports the cores each role used over the window, plus the
CPU every other process on the machine used (kernel threads included): load from
outside this benchmark (the machine is shared), which makes a noisy run visible. It also
counts each role's wake-ups per second: the voluntary context switches of each process'
main thread (one each time its event loop went to sleep with nothing to do and was
woken by a peer), the unit a request's CPU cost is made of when nothing batches.

Every figure is CPU time from /proc/<pid>/stat over wall time from the monotonic clock.
Not /proc/stat: on this virtual machine its per-CPU ticks drift from the wall clock by
-18 % to +31 % over 9 s windows of the same open-loop load (a tickless idle CPU's time
is exact there, the busy time sampled at ticks that short bursts of work fall between),
and a window once measured its span in them, which swung every "cores" figure with it.

A sample walks all of /proc, 1-3 ms of this process' CPU. Four a second on two cores
delay the checks being timed: at 1,000 checks/s the router's open-loop p99 was 1.01 ms
(median of five runs) with a window sampling beside it and 0.61 ms without. So a window
whose processes all outlive it (the open-loop rounds, a migration) samples its two ends
only (`interval=None`), and counts the CPU of the children that ended inside it (the
load generator, once waited for) from getrusage.

    with CpuWindow() as cpu:
        run_wrk(...)
    cpu.result  # {"seconds": 10.0, "cores": {"router": 0.93, "wrk": 0.11, ...}, ...}
"""

from __future__ import annotations

import os
import resource
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

PROC = Path("/proc")
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# bench.one_redis' Redis listens here, to be told from the cluster's by its process title
# (redis-server rewrites its command line to "redis-server HOST:PORT").
ONE_REDIS_HOST = "127.0.0.2"
# (substring of the command line, role); first match wins.
ROLES = (
    (f"redis-server {ONE_REDIS_HOST}:", "one-Redis redis"),
    ("redis-server", "redis"),
    ("redis-benchmark", "redis-benchmark"),
    ("cluster.cli serve router", "router"),
    ("cluster.cli serve node", "nodes"),
    ("cluster.cli up", "up supervisor"),
    ("bench.peers", "trivial aiohttp"),
    ("bench.instant_rls", "instant service"),
    ("bench.one_redis", "one-Redis aiohttp"),
    ("bench.openloop", "open-loop generator"),
    ("bench.sdk", "sdk/limits driver"),
    ("bench.quick", "quick probe"),
    ("bench.migration", "migration bench"),
    ("bench.memory", "memory bench"),
)


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, utime + stime in clock ticks) of `pid`, None if it is gone."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[11]) + int(fields[12])


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` so far, in seconds (0.0 once it is gone)."""
    stat = _stat(pid)
    return 0.0 if stat is None else stat[1] / CLK_TCK


def voluntary_switches(pid: int) -> int | None:
    """How many times `pid`'s main thread gave up the CPU to wait, None if it is gone."""
    try:
        status = (PROC / str(pid) / "status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    return None


def role_of(pid: int) -> str:
    try:
        argv = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    line = " ".join(a.decode(errors="replace") for a in argv if a)
    for needle, role in ROLES:
        if needle in line:
            return role
    return Path(argv[0].decode(errors="replace")).name or "unknown"


# The role of the children that ended inside a window sampled at its ends only.
ENDED_ROLE = "ended in the window"


def ended_children_s() -> float:
    """CPU seconds of this process' children that ended and were waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_table() -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, utime + stime in clock ticks)} of every process."""
    table: dict[int, tuple[int, int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                table[int(entry.name)] = stat
    return table


def below(root: int, table: dict[int, tuple[int, int]]) -> set[int]:
    """`root` and every process under it in `table`."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _ticks) in table.items():
        children.setdefault(parent, []).append(pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in table:
            found.add(pid)
        todo += children.get(pid, [])
    return found


def outside_ticks(
    first: dict[int, tuple[int, int]], last: dict[int, tuple[int, int]], ours: set[int]
) -> int:
    """CPU ticks that processes other than `ours` used between two process tables (one
    that appeared in between counts whole: it started inside)."""
    used = 0
    for pid, (_parent, ticks) in last.items():
        if pid not in ours:
            used += ticks - first[pid][1] if pid in first else ticks
    return max(0, used)


@dataclass
class CpuWindow:
    """Context manager: cores used per role while the block runs."""

    interval: float | None = 0.25  # None: sample the two ends only (see the module)
    root: int = field(default_factory=os.getpid)
    result: dict[str, Any] = field(default_factory=dict)
    _first: dict[int, int] = field(default_factory=dict)
    _last: dict[int, int] = field(default_factory=dict)
    _switches_first: dict[int, int] = field(default_factory=dict)
    _switches_last: dict[int, int] = field(default_factory=dict)
    _roles: dict[int, str] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _started: float = 0.0
    _table_first: dict[int, tuple[int, int]] = field(default_factory=dict)
    _table_last: dict[int, tuple[int, int]] = field(default_factory=dict)
    _ended_first: float = 0.0

    def _sample(self) -> None:
        self._table_last = process_table()
        for pid in below(self.root, self._table_last):
            ticks = self._table_last[pid][1]
            if pid not in self._roles:
                self._roles[pid] = "bench driver" if pid == self.root else role_of(pid)
            self._last[pid] = ticks
            switches = voluntary_switches(pid)
            if switches is not None:
                self._switches_last[pid] = switches

    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self._sample()

    def __enter__(self) -> CpuWindow:
        self._sample()
        self._first = dict(self._last)
        self._switches_first = dict(self._switches_last)
        self._table_first = self._table_last
        self._ended_first = ended_children_s()
        self._started = time.monotonic()
        if self.interval is not None:
            self._thread = threading.Thread(
                target=self._loop, args=(self.interval,), name="cpu-window", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        seconds = time.monotonic() - self._started
        per_role: dict[str, float] = {}
        for pid, ticks in self._last.items():
            used = ticks - self._first.get(pid, 0)
            role = self._roles[pid]
            per_role[role] = per_role.get(role, 0.0) + used / CLK_TCK
        if self.interval is None:
            # A sampled window counts an ended child up to its last sample; this one never
            # saw it, so it counts all the child used (it started inside the window).
            ended = ended_children_s() - self._ended_first
            if ended > 0:
                per_role[ENDED_ROLE] = ended
        woken: dict[str, int] = {}
        for pid, switches in self._switches_last.items():
            role = self._roles[pid]
            woken[role] = woken.get(role, 0) + switches - self._switches_first.get(pid, 0)
        ours = sum(per_role.values())
        outside = outside_ticks(self._table_first, self._table_last, set(self._last)) / CLK_TCK
        self.result = {
            "seconds": round(seconds, 2),
            "cpus": os.cpu_count() or 1,
            "cores": {
                role: round(used / seconds, 3)
                for role, used in sorted(per_role.items(), key=lambda kv: -kv[1])
                if used > 0
            },
            "wakeups_per_s": {
                role: round(count / seconds) for role, count in woken.items() if count > 0
            },
            "machine_busy_cores": round((ours + outside) / seconds, 2),
            "outside_this_benchmark_cores": round(outside / seconds, 2),
        }
