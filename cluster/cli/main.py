"""The `shardlimit` command: reads the arguments (cluster/cli/parser.py) and hands them
to the command's module."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

from cluster.cli import admin as admin_cli
from cluster.cli import compare
from cluster.cli import quota as quota_cli
from cluster.cli import rules as rules_cli
from cluster.cli import status as status_cli
from cluster.cli import usage as usage_cli
from cluster.cli.completion import cmd_completion
from cluster.cli.parser import build_parser
from cluster.cli.serve import cmd_node, cmd_router
from cluster.web import logs


def cmd_up(args: argparse.Namespace) -> int:
    from cluster.cli.serve import read_router_config, refuse
    from cluster.cli.up import run_up
    from cluster.local.router_config import tls_settings
    from cluster.local.up_options import UpOptions

    port = args.port
    if args.config is not None:  # refused before anything starts, as `serve router` would
        tls = tls_settings(args.config)
        if tls:
            return refuse(
                "up",
                f"{args.config}: router.{', router.'.join(tls)}: a local cluster runs without "
                "TLS; start a TLS cluster with `shardlimit serve node` and `serve router` "
                "(docs/tls.md)",
            )
        config = read_router_config(args.config)
        if isinstance(config, str):
            return refuse("up", config)
        if port is None and config.port:  # 0 (any free port) cannot start consecutive ones
            port = config.port
    endpoints = args.endpoints if args.endpoints is not None else 1 + args.replicas
    first = UpOptions.port if port is None else port
    for what, start, count in (
        ("routers", first, args.routers),
        ("node processes", args.base_port, args.nodes * endpoints),
    ):
        if start + count - 1 > 65535:
            return refuse("up", f"{count} {what} on consecutive ports from {start} run past 65535")
    options = UpOptions(
        nodes=args.nodes,
        partitioner=args.partitioner,
        port=first,
        base_port=args.base_port,
        host=args.host,
        data_dir=args.data_dir,
        config=args.config,
        appendfsync=args.appendfsync,
        test_clock=args.test_clock,
        routers=args.routers,
        grpc_port=args.grpc_port,
        envoy_config=args.envoy_config,
        replicas=args.replicas,
        endpoints=endpoints,
        down_after_ms=args.down_after_ms,
    )
    return run_up(options, args.json)


def bench_checkout() -> Path | None:
    """The source checkout holding bench/ next to this `cluster` package, if any."""
    root = Path(__file__).resolve().parents[2]  # cluster/cli/main.py -> the checkout
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
    ends it quietly, as it would a C program on SIGPIPE; Ctrl-C ends it with one line and
    128 + SIGINT, as a shell reports it."""
    try:
        code = _dispatch(argv)
        sys.stdout.flush()
    except KeyboardInterrupt:
        print("shardlimit: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that flush
        # cannot fail too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return code


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
        "usage": partial(admin_cli.run, usage_cli.cmd_usage),
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


if __name__ == "__main__":
    sys.exit(main())
