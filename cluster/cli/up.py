"""`shardlimit up`: a whole local cluster in the foreground until Ctrl-C / SIGTERM,
restarting any child that exits (cluster/local/supervisor.py)."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import secrets
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from cluster.local.cluster import LocalCluster
from cluster.local.supervisor import Restart
from cluster.local.up_options import UpOptions
from cluster.web.auth import ADMIN_TOKEN_ENV, CLUSTER_TOKEN_ENV

log = logging.getLogger("shardlimit.up")


def _say(as_json: bool, level: int, message: str, **fields: Any) -> None:
    """A line for a person on stderr, or with --json a JSON log line (extra fields)."""
    if as_json:
        log.log(level, message, extra=fields)
    else:
        print(message, file=sys.stderr, flush=True)


SAVED_AS = "cluster-token"  # under the data dir: the generated cluster token


def cluster_token(data_dir: Path) -> tuple[str, str]:
    """(the cluster token, where it comes from): SHARDLIMIT_CLUSTER_TOKEN, else the one
    saved under the data dir (mode 0600), else a new one saved there: a node started by
    hand joins with it, and a restart keeps it."""
    from_env = os.environ.get(CLUSTER_TOKEN_ENV)
    if from_env:
        return from_env, f"from {CLUSTER_TOKEN_ENV}"
    path = data_dir.resolve() / SAVED_AS
    if path.exists():
        return path.read_text().strip(), f"saved in {path}"
    token = secrets.token_urlsafe(24)
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    return token, f"saved in {path}"


def _report_restart(as_json: bool, restart: Restart) -> None:
    _say(
        as_json,
        logging.WARNING,
        restart.message,
        child=restart.name,
        returncode=restart.returncode,
        restart_in_s=restart.delay,
        restart=restart.attempt,
        log=str(restart.log),
    )


def run_up(options: UpOptions, as_json: bool) -> int:
    """With `as_json` the summary is one JSON line on stdout, and every log line (this
    command's on stderr, the children's in their log files) is a JSON object. A child
    that exits while the cluster runs is restarted, one log line each time. Exits 1
    when a child fails to start, 0 once stopped by a signal."""
    admin = os.environ.get(ADMIN_TOKEN_ENV) or secrets.token_urlsafe(24)
    try:
        token, token_source = cluster_token(options.data_dir)
    except OSError as exc:
        _say(as_json, logging.ERROR, f"shardlimit up failed: cluster token: {exc}")
        return 1
    options.json_logs = options.json_logs or as_json
    local = LocalCluster(options, admin, token)
    stop = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        local.start()
        info = local.summary()
        info["cluster_token"] = token_source
        if as_json:
            print(json.dumps(info), flush=True)
        else:
            print_summary(info)
        # Ticked from this thread: a child restarted from a thread that ends would get
        # PR_SET_PDEATHSIG with it (cluster/local/procs.py).
        supervisor = local.supervise(functools.partial(_report_restart, as_json), in_thread=False)
        while not stop.wait(0.1):
            supervisor.tick()
    except (RuntimeError, OSError) as exc:
        _say(as_json, logging.ERROR, f"shardlimit up failed: {exc}")
        return 1
    finally:
        with contextlib.suppress(KeyboardInterrupt):
            local.stop()
    if as_json:
        log.info("stopped: router, nodes and Redis processes are down")
    else:
        print("stopped: router, nodes and Redis processes are down", flush=True)
    return 0


def print_summary(info: dict[str, Any]) -> None:
    routers = info.get("routers") or [info["router"]]
    print(f"shardlimit is up: router {', '.join(routers)} ({info['partitioner']} partitioner)")
    for node in info["nodes"]:
        print(
            f"  node {node['id']:<4} {node['url']:<24} redis {node['redis']}  "
            f"data {node['redis_dir']}"
        )
        if node.get("replicas"):
            ports = ", ".join(str(port) for port in node["replicas"])
            print(f"       {'':<4} redis-servers on {node['redis_port']} (first primary), {ports}")
    sentinels: list[str] = next((n["sentinels"] for n in info["nodes"] if n.get("sentinels")), [])
    if sentinels:
        print(f"sentinels:    {', '.join(sentinels)} (each node's master name is its id)")
    print(f"data dir:     {info['data_dir']}")
    print(f"logs:         {info['logs']}")
    for note in info.get("notes") or []:
        print(f"note:         {note}")
    print(f"admin token:  {info['admin_token']}")
    source = info.get("cluster_token", "")
    if source.startswith("saved in "):
        path = source.removeprefix("saved in ")
        print(
            f"cluster token: {source} (mode 0600); a node started by hand joins with "
            f"SHARDLIMIT_CLUSTER_TOKEN=$(cat {path})"
        )
    else:
        print(f"cluster token: {source}")
    print(
        f"try:          curl -s -XPOST {info['router']}/v1/check "
        '-d \'{"key":"user:1","limits":[{"algorithm":"fixed_window",'
        '"limit":10,"window":"1m"}]}\''
    )
    print("A process that exits is restarted. Ctrl-C stops everything.", flush=True)
