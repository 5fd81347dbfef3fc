"""A whole local cluster for a benchmark: `shardlimit up --json` on free ports, stopped after.

with local_cluster(nodes=3) as info:
    info["router"]  # "http://127.0.0.1:P"
"""

from __future__ import annotations

import contextlib
import json
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.procs import free_port_range, python_env, python_module, running, tail
from cluster.redis_proc import free_port


@contextlib.contextmanager
def local_cluster(nodes: int = 3, within: float = 60.0) -> Iterator[dict[str, Any]]:
    """Router, `nodes` nodes and their Redis (AOF everysec, as `make run`); all stopped after."""
    data_dir = Path(tempfile.mkdtemp(prefix=f"sl-bench-up{nodes}-"))
    log = data_dir / "up.log"
    args = python_module("cluster.cli", "up", "--json", "--nodes", str(nodes),
                         "--port", str(free_port()), "--base-port", str(free_port_range(nodes)),
                         "--data-dir", str(data_dir))  # fmt: skip
    try:
        with running(args, stdout=subprocess.PIPE, log=log, env=python_env()) as up:
            assert up.stdout is not None
            deadline = time.monotonic() + within
            while not select.select([up.stdout], [], [], 0.2)[0]:
                if up.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"shardlimit up did not start:\n{tail(log)}")
            line = up.stdout.readline()
            if not line:
                raise RuntimeError(f"shardlimit up exited:\n{tail(log)}")
            info: dict[str, Any] = json.loads(line)
            info["pid"] = up.pid
            yield info
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
