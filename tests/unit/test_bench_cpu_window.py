"""A bench.cpu window sampled at its two ends only still counts the CPU of the children
that started and ended inside it (the load generator of an open-loop run)."""

from __future__ import annotations

import subprocess
import sys
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
    # getrusage counts it in clock ticks (10 ms), the window's span in them too
    assert cores[ENDED_ROLE] * seconds == pytest.approx(used_s, abs=0.05), cpu.result


def test_a_sampled_window_counts_a_child_by_its_role_and_not_twice() -> None:
    with CpuWindow(interval=0.05) as cpu:
        subprocess.run([sys.executable, "-c", BURNER], capture_output=True, check=True)
    cores = cpu.result["cores"]
    assert ENDED_ROLE not in cores, cpu.result
    assert cores.get(Path(sys.executable).name, 0) > 0, cpu.result
