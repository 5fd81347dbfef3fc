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

from cluster.cli.rules_notice import ACCEPTED, RulesFileWatch
from cluster.cli.serve import refuse
from cluster.local.cluster import LocalCluster
from cluster.local.data_dir_lock import hold_data_dir, release_data_dir
from cluster.local.redis_choice import choose_redis_server, save_record
from cluster.local.redis_proc import REDIS_SERVER_ENV
from cluster.local.router_config import configured_rules_file, envoy_descriptors
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


def _say_rules(as_json: bool, line: str) -> None:
    """A refused (or again accepted) edit of the rules file, on the console."""
    _say(as_json, logging.INFO if line.startswith(ACCEPTED) else logging.WARNING, line)


def refused_files(options: UpOptions) -> str | None:
    """Why the routers would refuse their rules file or the Envoy descriptors (None: they
    would not), read as they read them: one line naming the file."""
    import yaml

    from cluster.model.errors import ValidationError
    from router.envoy.descriptors import parse_options, parse_text
    from router.envoy.settings import EnvoySettings
    from router.errors import SettingsError
    from router.rules.book import RulesFileError, read_rules_file
    from router.rules.rejection import yaml_cause
    from router.rules.yaml_text import not_utf8

    rules = configured_rules_file(options)
    if rules is not None:
        try:
            read_rules_file(rules)
        except RulesFileError as exc:
            return str(exc)
    descriptors = envoy_descriptors(options, options.data_dir.resolve())
    if descriptors is None or not descriptors.exists():
        return None
    try:
        settings = EnvoySettings.from_env()
    except SettingsError as exc:
        return f"envoy settings: {exc}"
    try:
        parse_text(descriptors.read_bytes().decode("utf-8"), parse_options(settings))
    except OSError as exc:
        return f"cannot read {descriptors}: {exc.strerror or exc}"
    except UnicodeDecodeError as exc:
        return not_utf8(descriptors, exc)
    except yaml.YAMLError as exc:
        return yaml_cause(descriptors, exc)
    except ValidationError as exc:
        return f"{descriptors}: {exc}"
    return None


def run_up(options: UpOptions, as_json: bool) -> int:
    """With `as_json` the summary is one JSON line on stdout, and every log line (this
    command's on stderr, the children's in their log files) is a JSON object. A child
    that exits while the cluster runs is restarted, one log line each time. Exits 1
    when a child fails to start, 0 once stopped by a signal; 2, before anything starts,
    when the routers would refuse their rules file or Envoy descriptors."""
    refused = refused_files(options)
    if refused is not None:
        return refuse("up", refused)
    admin = os.environ.get(ADMIN_TOKEN_ENV) or secrets.token_urlsafe(24)
    routers = [f"http://{options.host}:{options.port + i}" for i in range(options.routers)]
    try:
        held = hold_data_dir(options.data_dir, routers)
    except (RuntimeError, OSError) as exc:
        _say(as_json, logging.ERROR, f"shardlimit up failed: {exc}")
        return 1
    try:
        return _run_held(options, as_json, admin)
    finally:
        release_data_dir(held)


def _run_held(options: UpOptions, as_json: bool, admin: str) -> int:
    """`run_up` once this process holds the data dir."""
    try:
        server = choose_redis_server(options.data_dir.resolve())
        token, token_source = cluster_token(options.data_dir)
    except RuntimeError as exc:
        _say(as_json, logging.ERROR, f"shardlimit up failed: {exc}")
        return 1
    except OSError as exc:
        _say(as_json, logging.ERROR, f"shardlimit up failed: cluster token: {exc}")
        return 1
    # Every Redis and Sentinel of this cluster runs it (redis_proc.redis_server_binary).
    os.environ[REDIS_SERVER_ENV] = server.binary
    options.json_logs = options.json_logs or as_json
    local = LocalCluster(options, admin, token)
    stop = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        local.start()
        save_record(local.data_dir, server)
        info = local.summary()
        info["cluster_token"] = token_source
        info["redis_server"] = str(server)
        if as_json:
            print(json.dumps(info), flush=True)
        else:
            print_summary(info)
        # Ticked from this thread: a child restarted from a thread that ends would get
        # PR_SET_PDEATHSIG with it (cluster/local/procs.py).
        supervisor = local.supervise(functools.partial(_report_restart, as_json), in_thread=False)
        rules_file = RulesFileWatch(local.router_url, functools.partial(_say_rules, as_json))
        while not stop.wait(0.1):
            supervisor.tick()
            rules_file.tick()
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
        for url in node.get("urls", [])[1:]:
            print(f"       {'':<4} {url:<24} (another endpoint of {node['id']})")
        if node.get("replicas"):
            ports = ", ".join(str(port) for port in node["replicas"])
            print(f"       {'':<4} redis-servers on {node['redis_port']} (first primary), {ports}")
    sentinels: list[str] = next((n["sentinels"] for n in info["nodes"] if n.get("sentinels")), [])
    if sentinels:
        print(f"sentinels:    {', '.join(sentinels)} (each node's master name is its id)")
    if info.get("redis_server"):
        print(f"redis-server: {info['redis_server']}")
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
