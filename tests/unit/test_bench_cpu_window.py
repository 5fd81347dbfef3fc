"""A bench.cpu window counts CPU time over wall-clock time: sampled at its two ends only it
still counts the children that started and ended inside it (the load generator of an
open-loop run), and the CPU of processes not below it is load from outside."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.cpu import ENDED_ROLE, CpuWindow

pytestmark = pytest.mark.timeout(30)

# Burns CPU for a while, then says how much its whole life used.
BURNER = """
import time
started = time.process_time()
while time.process_time() - started < 0.3:
    pass
print(time.process_time())
"""


def test_a_window_sampled_at_its_ends_counts_the_children_that_ended_inside_it() -> None:
    with CpuWindow(interval=None) as cpu:
        out = subprocess.run(
            [sys.executable, "-c", BURNER], capture_output=True, text=True, check=True
        ).stdout
    used_s = float(out)
    seconds, cores = cpu.result["seconds"], cpu.result["cores"]
    # No sample saw the child (the suite's own processes below this one may show up).
    assert Path(sys.executable).name not in cores, cpu.result
    # getrusage counts it in clock ticks (10 ms); the window's span is wall-clock time
    assert cores[ENDED_ROLE] * seconds == pytest.approx(used_s, abs=0.05), cpu.result


def test_a_sampled_window_counts_a_child_by_its_role_and_not_twice() -> None:
    with CpuWindow(interval=0.05) as cpu:
        subprocess.run([sys.executable, "-c", BURNER], capture_output=True, check=True)
    cores = cpu.result["cores"]
    assert ENDED_ROLE not in cores, cpu.result
    assert cores.get(Path(sys.executable).name, 0) > 0, cpu.result


# Starts a loop like BURNER's in a process of its own session that this one does not parent
# (its parent exits at once), which says when it is done burning, then waits to be killed
# (at most a minute, should the test die first).
DETACHED = """
import subprocess, sys
burner = "import os, time\\nstarted = time.process_time()\\nwhile time.process_time() - started < 0.3:\\n    pass\\nprint(os.getpid(), flush=True)\\ntime.sleep(60)"
subprocess.Popen([sys.executable, "-c", burner], start_new_session=True,
                 stdout=open(sys.argv[1], "w"))
"""


def test_the_cpu_of_a_process_not_below_the_window_is_outside_load(tmp_path: Path) -> None:
    said = tmp_path / "pid"
    try:
        with CpuWindow(interval=None) as cpu:
            subprocess.run([sys.executable, "-c", DETACHED, str(said)], check=True)
            deadline = time.monotonic() + 20
            while not said.read_text().strip():
                assert time.monotonic() < deadline, "the detached burner never finished"
                time.sleep(0.01)
    finally:
        if said.exists() and said.read_text().strip():
            os.kill(int(said.read_text()), signal.SIGKILL)
    outside = cpu.result["outside_this_benchmark_cores"] * cpu.result["seconds"]
    assert outside >= 0.25, cpu.result
    assert cpu.result["machine_busy_cores"] >= cpu.result["outside_this_benchmark_cores"]
