"""bench.cpu counts a process' wake-ups: each sleep of its main thread inside the window."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.compare import wakeups_per_check
from bench.cpu import CpuWindow

pytestmark = pytest.mark.timeout(30)

SLEEPER = """
import sys, time
sys.stdin.readline()
for _ in range(200):
    time.sleep(0.001)
print("slept", flush=True)
sys.stdin.readline()
"""


def test_each_sleep_of_a_main_thread_is_a_wake_up() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", SLEEPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        with CpuWindow(interval=0.05) as cpu:
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline() == "slept\n"
        child.stdin.write("stop\n")
        child.stdin.flush()
        assert child.wait(timeout=10) == 0
    finally:
        child.kill()
    role = Path(sys.executable).name
    woken = cpu.result["wakeups_per_s"][role] * cpu.result["seconds"]
    # 200 sleeps, the read of "go" and the write of "slept" (give or take rounding)
    assert 195 <= woken <= 260, cpu.result


def test_wakeups_per_check_divides_by_the_rate() -> None:
    cpu = {"wakeups_per_s": {"router": 2000, "nodes": 1500, "redis": 1000, "wrk": 7}}
    assert wakeups_per_check(cpu, 1000, ("router", "nodes", "redis")) == {
        "router": 2.0,
        "nodes": 1.5,
        "redis": 1.0,
        "total": 4.5,
    }
    assert wakeups_per_check({"cores": {}}, 1000, ("router",)) is None
