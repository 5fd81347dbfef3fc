"""`shardlimit serve router|node`: one service in this process, or one line on stderr
(exit status 2) naming the start-up setting that cannot work."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from cluster.web.auth import ADMIN_TOKEN_ENV, CLUSTER_TOKEN_ENV, token_from

if TYPE_CHECKING:
    from router.config import RouterConfig


def refuse(command: str, reason: str) -> int:
    """What a command cannot do as asked (a start-up setting that cannot work, an
    impossible request): one line on stderr, exit status 2."""
    print(f"shardlimit {command}: {reason}", file=sys.stderr)
    return 2


def _unwritable(directory: Path) -> str | None:
    """Why the router could not keep its files in `directory` (None: it can)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        return f"{directory} is not a writable directory: {exc.strerror or exc}"
    return None


def read_router_config(path: Path) -> RouterConfig | str:
    """A cluster.yaml's settings, or the one line that says why they cannot serve (the
    file unreadable, not YAML, or a setting refused). `serve router` and `up` read it."""
    import yaml

    from cluster.model.errors import ValidationError
    from router.config import load_config
    from router.rules.rejection import yaml_cause

    try:
        return load_config(path)
    except ValidationError as exc:
        return f"{path}: {exc}"
    except OSError as exc:
        return f"cannot read {path}: {exc}"
    except yaml.YAMLError as exc:
        return yaml_cause(path, exc)


def cmd_router(args: argparse.Namespace) -> int:
    from cluster.web.serve import CannotListenError, run_app
    from cluster.web.tls import TlsError
    from router.app import ROUTER, create_app
    from router.errors import SettingsError
    from router.front.server import front_for

    config = read_router_config(args.config)
    if isinstance(config, str):
        return refuse("router", config)
    data_dir_problem = _unwritable(config.data_dir)
    if data_dir_problem is not None:
        return refuse("router", f"{args.config}: router.data_dir {data_dir_problem}")
    if args.host:
        config.host = args.host
    if args.port is not None:
        config.port = args.port
    try:
        admin = token_from(ADMIN_TOKEN_ENV, args.admin_token_file)
        cluster_token = token_from(CLUSTER_TOKEN_ENV, args.cluster_token_file)
    except OSError as exc:
        return refuse("router", f"cannot read a token file: {exc}")
    if admin is None:
        logging.warning("no admin token set (%s): rule writes are open", ADMIN_TOKEN_ENV)
    try:
        server_ssl = config.tls.server_context(client_certs=False)  # applications: none
        app = create_app(config, admin, cluster_token)
    except (TlsError, SettingsError) as exc:
        return refuse("router", str(exc))
    try:
        run_app(
            app,
            config.host,
            config.port,
            on_hup=app[ROUTER].reload_rules,
            ssl_context=server_ssl,
            front=front_for(app),
        )
    except (CannotListenError, SettingsError) as exc:
        return refuse("router", str(exc))
    return 0


_REDIS_TLS_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")


def _redis_url_problem(url: str) -> str | None:
    """Why the node cannot use `url` (redis://, rediss:// with ssl_* files, unix://,
    redis+sentinel://)."""
    from redis.asyncio.connection import parse_url

    from cluster.model.sentinel_url import is_sentinel_url, parse_sentinel_url

    if is_sentinel_url(url):
        try:
            parse_sentinel_url(url)
        except ValueError as exc:
            return str(exc)
        return None
    try:
        settings: dict[str, object] = dict(parse_url(url))
    except ValueError as exc:
        return str(exc)
    for name in _REDIS_TLS_FILES:
        value = settings.get(name)
        if isinstance(value, str) and not os.access(value, os.R_OK):
            return f"{name}: cannot read {value}"
    return None


_NODE_TLS_FLAGS = {
    "cert": "--tls-cert",
    "key": "--tls-key",
    "ca": "--tls-ca",
    "mutual": "--tls-mutual",
}


def cmd_node(args: argparse.Namespace) -> int:
    from cluster.web.serve import CannotListenError, run_app
    from cluster.web.tls import TlsError, TlsFiles
    from node.app import create_app
    from node.config import NodeConfig

    tls = TlsFiles(args.tls_cert, args.tls_key, args.tls_ca, args.tls_mutual)
    problems = tls.problems(_NODE_TLS_FLAGS.__getitem__)
    if problems:
        return refuse("node", "; ".join(f"{flag}: {message}" for flag, message in problems))
    redis_problem = _redis_url_problem(args.redis)
    if redis_problem is not None:
        return refuse("node", f"--redis: {redis_problem}")
    try:
        cluster_token = token_from(CLUSTER_TOKEN_ENV, args.cluster_token_file)
    except OSError as exc:
        return refuse("node", f"cannot read --cluster-token-file: {exc}")
    if cluster_token is None:
        logging.warning("no cluster token set (%s): node endpoints are open", CLUSTER_TOKEN_ENV)
    try:
        server_ssl = tls.server_context(client_certs=tls.mutual)
        client_ssl = tls.client_context()
        app = create_app(
            NodeConfig(
                args.id,
                args.redis,
                cluster_token,
                test_mode=args.test_clock,
                host=args.host,
                channel_port=args.channel_port,
                liveness_port=args.liveness_port,
                server_ssl=server_ssl,
                client_ssl=client_ssl,
            )
        )
    except (TlsError, CannotListenError) as exc:
        return refuse("node", str(exc))
    try:
        run_app(app, args.host, args.port, ssl_context=server_ssl)
    except CannotListenError as exc:
        return refuse("node", str(exc))
    return 0
