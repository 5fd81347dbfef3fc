"""One `shardlimit up` per data dir: it holds `<data dir>/up.lock` (an flock, released
when the process ends however it ends) naming its pid and routers, so a second `up` on
the same data dir refuses at once, saying which running cluster holds it."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import IO

LOCK = "up.lock"


def _holder(handle: IO[str]) -> str:
    """Who holds the lock, as its file says: 'pid N) whose router is URL'."""
    handle.seek(0)
    try:
        said = json.loads(handle.read() or "{}")
        routers = ", ".join(said["routers"])
        return f"pid {said['pid']}) whose router is {routers}"
    except (ValueError, KeyError, TypeError):
        return "starting)"


def hold_data_dir(data_dir: Path, routers: list[str]) -> IO[str]:
    """Take `data_dir` for this process (keep the returned file open until it stops), or
    raise RuntimeError in one line naming the running cluster that holds it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir.resolve() / LOCK
    handle = path.open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(handle)
        handle.close()
        raise RuntimeError(
            f"{data_dir.resolve()} is in use by a running cluster (shardlimit up, {holder}: "
            "stop it first (Ctrl-C where it runs), or give this one another --data-dir. "
            "Nothing was started"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"pid": os.getpid(), "routers": routers}) + "\n")
    handle.flush()
    return handle


def release_data_dir(handle: IO[str]) -> None:
    with contextlib.suppress(OSError):
        handle.truncate(0)
        handle.close()
