"""The `shardlimit` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import NoReturn

from cluster.cli import admin as admin_cli
from cluster.cli import compare
from cluster.cli import quota as quota_cli
from cluster.cli import rules as rules_cli
from cluster.cli import status as status_cli
from cluster.web import logs
from cluster.web.auth import ADMIN_TOKEN_ENV, CLUSTER_TOKEN_ENV, token_from

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


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= 64:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to 64, not {value!r}")
    return number


class Parser(argparse.ArgumentParser):
    """A user mistake is one line on stderr (and exit status 2), never a usage screen."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _json_logs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help="log lines as JSON objects, one a line (ts, level, logger, message and extra fields)",
    )


def _router_server_args(router: argparse.ArgumentParser) -> None:
    router.add_argument("--config", type=Path, required=True, help="the cluster.yaml to serve")
    router.add_argument("--host", help="listen on this address (default: the config's host)")
    router.add_argument("--port", type=int, help="listen on this port (default: the config's)")
    router.add_argument(
        "--cluster-token-file", help=f"the cluster token (else env {CLUSTER_TOKEN_ENV})"
    )
    router.add_argument("--admin-token-file", help=f"the admin token (else env {ADMIN_TOKEN_ENV})")
    _json_logs(router)


def _node_server_args(node: argparse.ArgumentParser) -> None:
    node.add_argument("--id", required=True, help="the node's id in the cluster (e.g. n1)")
    node.add_argument("--host", default="127.0.0.1", help="listen on this address")
    node.add_argument("--port", type=int, required=True, help="listen on this port")
    node.add_argument("--redis", required=True, help="redis://host:port/db")
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


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="shardlimit", description="sharded rate limiter")
    parser.add_argument("--version", action="version", version=f"shardlimit {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="start a local cluster: router, nodes, Redis")
    up.add_argument("--nodes", type=int, default=3, help="counter nodes to start (default 3)")
    up.add_argument(
        "--partitioner",
        choices=("ring", "slots"),
        default="ring",
        help="consistent-hash ring or CRC16 slots (default ring)",
    )
    up.add_argument("--host", default="127.0.0.1", help="address every process listens on")
    up.add_argument("--port", type=int, default=8080, help="the first router's port")
    up.add_argument(
        "--routers",
        type=_positive,
        default=1,
        help="routers to start, on consecutive ports from --port",
    )
    up.add_argument(
        "--base-port",
        type=int,
        default=7001,
        help="the first node's port; the others follow (default 7001)",
    )
    up.add_argument(
        "--data-dir",
        type=Path,
        default=Path("data"),
        help="Redis files, topology, logs (default ./data)",
    )
    up.add_argument("--config", type=Path, help="cluster.yaml for router settings and rules file")
    up.add_argument(
        "--appendfsync",
        choices=("always", "everysec"),
        default="everysec",
        help="Redis AOF fsync policy (default everysec)",
    )
    up.add_argument("--test-clock", action="store_true", help=argparse.SUPPRESS)
    up.add_argument(
        "--grpc-port", type=int, help="Envoy's rate-limit gRPC service on this port (first router)"
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
    servers = serve.add_subparsers(dest="service", required=True, metavar="{router,node}")
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
    rules_cli.add_arguments(sub, _add_router_args)
    return parser


def _refuse(command: str, reason: str) -> int:
    """A start-up setting that cannot work: one line on stderr, exit status 2."""
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


def cmd_router(args: argparse.Namespace) -> int:
    import yaml

    from cluster.model.errors import ValidationError
    from cluster.web.serve import CannotListenError, run_app
    from cluster.web.tls import TlsError
    from router.app import ROUTER, create_app
    from router.config import load_config
    from router.front.server import front_for

    try:
        config = load_config(args.config)
    except ValidationError as exc:
        return _refuse("router", f"{args.config}: {exc}")
    except (OSError, yaml.YAMLError) as exc:
        return _refuse("router", f"cannot read {args.config}: {exc}")
    data_dir_problem = _unwritable(config.data_dir)
    if data_dir_problem is not None:
        return _refuse("router", f"{args.config}: router.data_dir {data_dir_problem}")
    if args.host:
        config.host = args.host
    if args.port is not None:
        config.port = args.port
    try:
        admin = token_from(ADMIN_TOKEN_ENV, args.admin_token_file)
        cluster_token = token_from(CLUSTER_TOKEN_ENV, args.cluster_token_file)
    except OSError as exc:
        return _refuse("router", f"cannot read a token file: {exc}")
    if admin is None:
        logging.warning("no admin token set (%s): rule writes are open", ADMIN_TOKEN_ENV)
    try:
        server_ssl = config.tls.server_context(client_certs=False)  # applications: none
        app = create_app(config, admin, cluster_token)
    except TlsError as exc:
        return _refuse("router", str(exc))
    try:
        run_app(
            app,
            config.host,
            config.port,
            on_hup=app[ROUTER].reload_rules,
            ssl_context=server_ssl,
            front=front_for(app),
        )
    except CannotListenError as exc:
        return _refuse("router", str(exc))
    return 0


_REDIS_TLS_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")


def _redis_url_problem(url: str) -> str | None:
    """Why redis-py cannot use `url` (redis://, rediss:// with ssl_* files, unix://)."""
    from redis.asyncio.connection import parse_url

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
        return _refuse("node", "; ".join(f"{flag}: {message}" for flag, message in problems))
    redis_problem = _redis_url_problem(args.redis)
    if redis_problem is not None:
        return _refuse("node", f"--redis: {redis_problem}")
    try:
        cluster_token = token_from(CLUSTER_TOKEN_ENV, args.cluster_token_file)
    except OSError as exc:
        return _refuse("node", f"cannot read --cluster-token-file: {exc}")
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
                server_ssl=server_ssl,
                client_ssl=client_ssl,
            )
        )
    except TlsError as exc:
        return _refuse("node", str(exc))
    try:
        run_app(app, args.host, args.port, ssl_context=server_ssl)
    except CannotListenError as exc:
        return _refuse("node", str(exc))
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from cluster.cli.up import run_up
    from cluster.local.cluster import UpOptions

    options = UpOptions(
        nodes=args.nodes,
        partitioner=args.partitioner,
        port=args.port,
        base_port=args.base_port,
        host=args.host,
        data_dir=args.data_dir,
        config=args.config,
        appendfsync=args.appendfsync,
        test_clock=args.test_clock,
        routers=args.routers,
        grpc_port=args.grpc_port,
        envoy_config=args.envoy_config,
    )
    return run_up(options, args.json)


def bench_checkout() -> Path | None:
    """The source checkout holding bench/ next to this `cluster` package, if any."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "bench" / "run.py").is_file() else None


def cmd_bench(argv: list[str]) -> int:
    """`shardlimit bench`: bench.run's main from the source checkout (bench/ is not installed)."""
    root = bench_checkout()
    if root is None:
        print(
            "shardlimit: `shardlimit bench` needs a source checkout: bench/ is not installed "
            f"with the package and is not next to {Path(__file__).resolve().parent}; "
            "run it from a clone (`make bench`)",
            file=sys.stderr,
        )
        return 2
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from bench import run  # type: ignore[import-not-found,unused-ignore]

    if "--json" not in argv and "--table" not in argv:
        argv = [*argv, "--table"]
    code: int = run.main(argv, prog="shardlimit bench")
    return code


def main(argv: list[str] | None = None) -> int:
    """The command; output cut short by the reader (`shardlimit compare --json | head`)
    ends it quietly, as it would a C program on SIGPIPE."""
    try:
        code = _dispatch(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that flush
        # cannot fail too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return code


def _version() -> str:
    try:
        return metadata.version("shardlimit")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown (not installed)"


def _dispatch(argv: list[str] | None) -> int:
    argv = legacy_spelling(list(sys.argv[1:] if argv is None else argv))
    if argv[:1] == ["bench"]:
        return cmd_bench(argv[1:])
    if argv[:1] == ["completion"]:
        return cmd_completion(argv[1:])
    args = build_parser().parse_args(argv)
    logs.configure(as_json=bool(getattr(args, "json", False)))
    if args.command == "serve":
        return cmd_router(args) if args.service == "router" else cmd_node(args)
    if args.command == "node":
        handler = admin_cli.cmd_node_add if args.node_action == "add" else admin_cli.cmd_node_remove
        return admin_cli.run(handler, args)
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "up": cmd_up,
        "status": partial(admin_cli.run, status_cli.cmd_status),
        "compare": compare.run,
        "reshard": partial(admin_cli.run, _reshard),
        "rules": partial(admin_cli.run, rules_cli.cmd_rules),
        "quota": partial(admin_cli.run, quota_cli.cmd_quota),
    }
    return handlers[args.command](args)


def _reshard(args: argparse.Namespace) -> int:
    if args.action == "status":
        return status_cli.cmd_reshard_status(args)
    return admin_cli.cmd_reshard(args)


def legacy_spelling(argv: list[str]) -> list[str]:
    """The spellings of the previous release, kept for one more: `shardlimit router ...`
    and `shardlimit node --id ...` (now `serve router|node`), `node-add`/`node-remove`
    (now `node add|remove`). A note on stderr says the new spelling."""
    new: list[str] | None = None
    if argv[:1] == ["router"]:
        new = ["serve", "router", *argv[1:]]
    elif (
        argv[:1] == ["node"]
        and len(argv) > 1
        and argv[1].startswith("-")
        and argv[1] not in ("-h", "--help")
    ):
        new = ["serve", "node", *argv[1:]]
    elif argv[:1] in (["node-add"], ["node-remove"]):
        new = ["node", argv[0].removeprefix("node-"), *argv[1:]]
    if new is None:
        return argv
    print(
        f"shardlimit: `{argv[0]}` is now `{' '.join(new[:2])}` (the old spelling goes "
        "in the next release)",
        file=sys.stderr,
    )
    return new


COMPLETION_HELP = """usage: shardlimit completion [--json] {bash,zsh}

Print a completion script for shardlimit's commands and options.

  bash: eval "$(shardlimit completion bash)"   (e.g. in ~/.bashrc)
  zsh:  eval "$(shardlimit completion zsh)"    (e.g. in ~/.zshrc)

options:
  -h, --help  show this help message and exit
  --json      {"shell": ..., "script": ...} on one line, for an installer
"""


def cmd_completion(argv: list[str]) -> int:
    """`shardlimit completion bash|zsh [--json]`: a completion script for commands and
    options; with --json, {"shell": ..., "script": ...} for a script that installs it."""
    if "-h" in argv or "--help" in argv:
        print(COMPLETION_HELP, end="")
        return 0
    as_json = "--json" in argv
    words = [a for a in argv if a != "--json"]
    shell = words[0] if words else "bash"
    if shell not in ("bash", "zsh") or len(words) > 1:
        print(
            f"shardlimit: error: completion takes bash or zsh, not {' '.join(words)!r}",
            file=sys.stderr,
        )
        return 2
    script = completion_script(build_parser(), shell)
    if as_json:
        print(json.dumps({"shell": shell, "script": script}))
    else:
        print(script, end="")
    return 0


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> list[str]:
    shown = (a for a in parser._actions if a.help != argparse.SUPPRESS)
    return sorted(o for a in shown for o in a.option_strings if o.startswith("--"))


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """Words per command path ("", "serve", "serve router", ...), completed by position."""
    table: dict[str, list[str]] = {}

    def walk(path: str, node: argparse.ArgumentParser) -> None:
        children = _subcommands(node)
        table[path] = sorted(children) + _options(node)
        for name, child in children.items():
            walk(f"{path} {name}".strip(), child)

    walk("", parser)
    table[""] += ["bench", "completion"]
    table["completion"] = ["--json", "bash", "zsh"]
    cases = "\n".join(
        f'        "{path}") words="{" ".join(words)}" ;;' for path, words in sorted(table.items())
    )
    script = f"""# shardlimit {shell} completion: eval "$(shardlimit completion {shell})"
_shardlimit() {{
    local cur path="" i
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in -*) break ;; esac
        path="${{path:+$path }}${{COMP_WORDS[i]}}"
    done
    local words=""
    case "$path" in
{cases}
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
"""
    if shell == "zsh":
        script += "autoload -U +X bashcompinit && bashcompinit\n"
    return script + "complete -o default -F _shardlimit shardlimit\n"


if __name__ == "__main__":
    sys.exit(main())
