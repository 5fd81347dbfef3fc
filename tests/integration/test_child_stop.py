"""Stopping a child process (cluster/local/procs.py): a child that lets a SIGTERM pass
without exiting, as a Redis writing its first AOF does ("Writing initial AOF, can't
exit"), is asked again when told to insist, and exits on its own; asked once, it is
killed when the grace is over."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from cluster.local.procs import ChildProcess

pytestmark = pytest.mark.timeout(60)

# Exits with 7 on its second SIGTERM; says "ready" once its handler is set.
REFUSES_ONCE = """
import signal, sys, time
terms = 0
def on_term(signum, frame):
    global terms
    terms += 1
    if terms == 2:
        sys.exit(7)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def _child(tmp_path: Path) -> ChildProcess:
    log = tmp_path / "child.log"
    child = ChildProcess(
        "refuses-once",
        [sys.executable, "-c", REFUSES_ONCE],
        log=log,
        probe=lambda: log.exists() and "ready" in log.read_text(),
    )
    child.start(within=30)
    return child


def test_a_child_asked_again_exits_on_its_own(tmp_path: Path) -> None:
    child = _child(tmp_path)
    child.stop(grace=30, insist_s=0.1)
    assert child.returncode == 7


def test_a_child_asked_once_is_killed_after_the_grace(tmp_path: Path) -> None:
    child = _child(tmp_path)
    child.stop(grace=1)
    assert child.returncode == -signal.SIGKILL
