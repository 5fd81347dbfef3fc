"""A node whose name the DNS answers slowly: the router's connect gives up at the caller's
timeout and leaves nothing behind, where uvloop's create_connection leaves a lookup
future that fails unread, logged as an error at every attempt (cluster/web/connect.py).

The DNS is a server that never answers, named by a private /etc/resolv.conf in a mount
namespace of the probe's own (unshare -m, as root)."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NEVER_RETRIEVED = "Future exception was never retrieved"


def test_a_connect_given_up_during_a_slow_lookup_leaves_no_error(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1), for a private /etc/resolv.conf")
    dns = f"127.0.{random.randrange(1, 250)}.{random.randrange(2, 250)}"
    resolv = tmp_path / "resolv.conf"
    resolv.write_text(f"nameserver {dns}\noptions timeout:1 attempts:1\n")
    probe = f"{sys.executable} -m tests.support.slow_dns_probe --dns {dns}"
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount --bind {resolv} /etc/resolv.conf && exec {probe}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # The environment reproduces the leak: uvloop's own create_connection shows it.
    assert report["create_connection"]["outcome"] == "TimeoutError", report
    assert any(NEVER_RETRIEVED in m for m in report["create_connection"]["logged"]), report
    assert report["connect"] == {"outcome": "TimeoutError", "logged": []}, report
