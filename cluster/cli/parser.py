"""The `shardlimit` command's argument parser: every command and its options (the
commands' own modules add theirs)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from cluster.cli import admin as admin_cli
from cluster.cli import compare
from cluster.cli import quota as quota_cli
from cluster.cli import rules as rules_cli
from cluster.cli import usage as usage_cli
from cluster.cli.command_tree import Commands, Parser
from cluster.local.up_options import DOWN_AFTER_MS
from cluster.web.auth import ADMIN_TOKEN_ENV, CLUSTER_TOKEN_ENV

DEFAULT_ROUTER = "http://127.0.0.1:8080"


def _add_router_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--router",
        default=os.environ.get("SHARDLIMIT_ROUTER", DEFAULT_ROUTER),
        help="router URL (env SHARDLIMIT_ROUTER)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get(ADMIN_TOKEN_ENV),
        help=f"admin token (env {ADMIN_TOKEN_ENV})",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _whole_number(low: int, high: int, what: str = "a whole number") -> Callable[[str], int]:
    """An argparse type: ASCII digits for a number from `low` to `high`, else one line
    naming the range (a bare int() would take " 5", "+5" and "²" or die on them)."""

    def parse(value: str) -> int:
        if not (value.isascii() and value.isdigit()) or not low <= int(value) <= high:
            raise argparse.ArgumentTypeError(f"must be {what} from {low} to {high}, not {value!r}")
        return int(value)

    return parse


_positive = _whole_number(1, 64)
_port = _whole_number(1, 65535, "a TCP port")
_replicas = _whole_number(0, 8)
_endpoints = _whole_number(1, 9)
_down_after_ms = _whole_number(100, 3_600_000, "milliseconds")


def _json_logs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help="log lines as JSON objects, one a line (ts, level, logger, message and extra fields)",
    )


def _router_server_args(router: argparse.ArgumentParser) -> None:
    router.add_argument("--config", type=Path, required=True, help="the cluster.yaml to serve")
    router.add_argument("--host", help="listen on this address (default: the config's host)")
    router.add_argument("--port", type=_port, help="listen on this port (default: the config's)")
    router.add_argument(
        "--cluster-token-file", help=f"the cluster token (else env {CLUSTER_TOKEN_ENV})"
    )
    router.add_argument("--admin-token-file", help=f"the admin token (else env {ADMIN_TOKEN_ENV})")
    _json_logs(router)


def _node_server_args(node: argparse.ArgumentParser) -> None:
    node.add_argument(
        "--id", required=True, type=admin_cli.node_id, help="the node's id in the cluster (e.g. n1)"
    )
    node.add_argument("--host", default="127.0.0.1", help="listen on this address")
    node.add_argument("--port", type=_port, required=True, help="listen on this port")
    node.add_argument(
        "--channel-port",
        type=_port,
        default=0,
        help="the routers' binary channel's port (default: an ephemeral one, announced)",
    )
    node.add_argument(
        "--liveness-port",
        type=_port,
        default=0,
        help="the liveness probe's port (default: an ephemeral one, announced)",
    )
    node.add_argument(
        "--redis",
        required=True,
        help="redis://host:port/db, or redis+sentinel://host:port[,host:port...]/master-name",
    )
    node.add_argument(
        "--cluster-token-file", help=f"the cluster token (else env {CLUSTER_TOKEN_ENV})"
    )
    node.add_argument("--tls-cert", type=Path, help="the listener's certificate (PEM): HTTPS")
    node.add_argument("--tls-key", type=Path, help="the key of --tls-cert (PEM)")
    node.add_argument("--tls-ca", type=Path, help="the CA peers' certificates must chain to (PEM)")
    node.add_argument(
        "--tls-mutual",
        action="store_true",
        help="require client certificates signed by --tls-ca; present --tls-cert to peer nodes",
    )
    # The test suite's controllable clock; documented in tests/conftest.py only.
    node.add_argument("--test-clock", action="store_true", help=argparse.SUPPRESS)
    _json_logs(node)


def build_parser() -> Parser:
    parser = Parser(
        prog="shardlimit",
        description="sharded rate limiter",
        epilog="exit status: 0 done; 1 the cluster could not do it (the router unreachable, "
        "an HTTP 5xx, a migration paused); 2 a mistake in the command or its input "
        "(usage, a bad file, an HTTP 4xx refusal)",
    )
    parser.add_argument("--version", action="version", version=f"shardlimit {_version()}")
    sub = Commands(parser, dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser(
        "up",
        help="start a local cluster: router, nodes, Redis",
        description="Start a local cluster in the foreground: routers, counter nodes and "
        "their Redis (with --replicas, replica redis-servers and 3 Redis Sentinels that "
        "fail a primary over). A process that exits is restarted, after 0.5 s doubling to "
        "10 s while it keeps exiting; counters live in Redis (AOF) and survive. Ctrl-C or "
        "SIGTERM stops everything. `up` again on the same --data-dir brings back the same "
        "cluster: its nodes, their Redis, replicas and Sentinels, on the same ports.",
    )
    up.add_argument("--nodes", type=_positive, default=3, help="counter nodes to start (default 3)")
    up.add_argument(
        "--replicas",
        type=_replicas,
        default=0,
        metavar="N",
        help="replica redis-servers per node, failed over by 3 Redis Sentinels (default 0: "
        "one Redis per node); a data dir keeps the count it was started with",
    )
    up.add_argument(
        "--endpoints",
        type=_endpoints,
        default=None,
        metavar="K",
        help="node processes per shard, each as if on a host of its own (default: one per "
        "Redis of the shard, so 1 + --replicas): a shard keeps serving when a whole host, "
        "node process and Redis, is lost",
    )
    up.add_argument(
        "--down-after-ms",
        type=_down_after_ms,
        default=DOWN_AFTER_MS,
        metavar="MS",
        help="with --replicas: how long the Sentinels wait before they fail over a "
        f"primary that does not answer (default {DOWN_AFTER_MS}; a data dir keeps it)",
    )
    up.add_argument(
        "--partitioner",
        choices=("ring", "slots"),
        default="ring",
        help="consistent-hash ring or CRC16 slots (default ring)",
    )
    up.add_argument("--host", default="127.0.0.1", help="address every process listens on")
    up.add_argument(
        "--port",
        type=_port,
        help="the first router's port (default: --config's router.port, else 8080)",
    )
    up.add_argument(
        "--routers",
        type=_positive,
        default=1,
        help="routers to start, on consecutive ports from --port",
    )
    up.add_argument(
        "--base-port",
        type=_port,
        default=7001,
        help="the first node's port; the others follow (default 7001)",
    )
    up.add_argument(
        "--data-dir",
        type=Path,
        default=Path("data"),
        help="Redis files, topology, logs (default ./data)",
    )
    up.add_argument(
        "--config",
        type=Path,
        help="cluster.yaml for router settings and rules file (its nodes are the ones up starts)",
    )
    up.add_argument(
        "--appendfsync",
        choices=("always", "everysec"),
        default="everysec",
        help="Redis AOF fsync policy (default everysec)",
    )
    up.add_argument("--test-clock", action="store_true", help=argparse.SUPPRESS)
    up.add_argument(
        "--grpc-port",
        type=_port,
        help="Envoy's rate-limit gRPC service on this port (first router)",
    )
    up.add_argument(
        "--envoy-config",
        type=Path,
        help="Envoy descriptors YAML (default: <data dir>/ratelimit.yaml)",
    )
    up.add_argument(
        "--json",
        action="store_true",
        help="the summary as one JSON line on stdout; every log line (up's, "
        "the routers' and nodes') as a JSON object",
    )

    serve = sub.add_parser("serve", help="run one service: a router or a counter node")
    servers = Commands(serve, dest="service", required=True, metavar="{router,node}")
    _router_server_args(servers.add_parser("router", help="run one router"))
    _node_server_args(servers.add_parser("node", help="run one counter node"))

    compare.add_arguments(
        sub.add_parser("compare", help="ring vs slots: keys moved and balance on a resize")
    )

    # Listed for --help only: main() hands `bench ...` to bench.run's own parser.
    sub.add_parser(
        "bench",
        help="benchmark suite (source checkout): bench [--only NAME[,NAME]] [--skip ...] [--json]",
        add_help=False,
    )

    # Listed for --help only: main() answers `completion ...` itself.
    sub.add_parser(
        "completion",
        help="a shell completion script: completion bash|zsh [--json]",
        add_help=False,
    )

    status = sub.add_parser("status", help="topology and node state")
    _add_router_args(status)
    admin_cli.add_arguments(sub, _add_router_args)
    quota_cli.add_arguments(sub, _add_router_args)
    usage_cli.add_arguments(sub, _add_router_args)
    rules_cli.add_arguments(sub, _add_router_args)
    return parser


def _version() -> str:
    try:
        return metadata.version("shardlimit")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown (not installed)"
