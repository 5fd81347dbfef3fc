"""What the benchmarks' child processes need besides the launcher (cluster.local.procs): the
environment of `python -m bench.*` children, and the external tools they run."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def python_env(**extra: str) -> dict[str, str]:
    """The environment for `python -m ...` children: quiet logs, the checkout on sys.path."""
    env = dict(os.environ, SHARDLIMIT_LOG_LEVEL="WARNING", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def require_tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed: run `make bench-deps` (apt-get install)")
    return found
