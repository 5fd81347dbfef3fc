"""The `shardlimit` command: serve, up, status, node add/remove, reshard, rules, quota, usage,
compare, bench.

The only part of `cluster` allowed to import `router` or `node` (it runs them in
this process for `shardlimit serve`). Nothing imports the CLI but tests.
"""

from __future__ import annotations

import sys

# What `pip install 'shardlimit[server]'` brings (pyproject.toml); import names.
SERVER_EXTRA = {"redis", "hiredis", "uhashring", "yaml", "uvloop", "rich", "prometheus_client"}


def console() -> int:
    """The console script: the command, or one line when the server extra is missing."""
    try:
        from cluster.cli.main import main as run
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in SERVER_EXTRA:
            raise
        print(
            f"shardlimit: {exc.name} is missing: the command needs the server extra "
            "(pip install 'shardlimit[server]')",
            file=sys.stderr,
        )
        return 1
    return run()
