"""CLI commands that drive a running cluster through the router's admin API."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cluster.cli.command_tree import Commands

# Exit statuses (the --help epilog says them): 0 done.
CLUSTER_FAILED = 1  # the cluster could not do it: router unreachable, an HTTP 5xx
MISTAKE = 2  # a mistake in the command or its input: usage, a bad file, an HTTP 4xx


class AdminError(Exception):
    """A refusal or an unreachable router: one line for the user, and the exit status
    `code` (MISTAKE unless the cluster failed). `errors` holds the field errors of a 400
    problem ((field, message) pairs), for commands that name their flags instead."""

    def __init__(
        self, message: str, errors: list[tuple[str, str]] | None = None, code: int = MISTAKE
    ) -> None:
        super().__init__(message)
        self.errors = errors or []
        self.code = code


def router_url(value: str) -> str:
    """The router's base URL; `host:port` without a scheme means http://host:port."""
    if "://" not in value:
        value = f"http://{value}"
    scheme = value.split("://", 1)[0].lower()
    if scheme not in ("http", "https"):
        raise AdminError(f"--router must be an http:// or https:// URL, not {value!r}")
    return value.rstrip("/")


def _refusal(
    args: argparse.Namespace, method: str, path: str, exc: urllib.error.HTTPError
) -> AdminError:
    try:
        problem = json.loads(exc.read())
        detail = problem.get("detail", exc.reason)
        errors = [(e["field"], e["message"]) for e in problem.get("errors") or []]
    except (ValueError, AttributeError, KeyError, TypeError):
        detail, errors = exc.reason, []
    if exc.code == 401 and args.token:
        reason = "the router's admin token differs from --token / SHARDLIMIT_ADMIN_TOKEN"
        return AdminError(f"{method} {path}: token rejected (401): {reason}")
    if exc.code == 401:
        hint = "pass --token or set SHARDLIMIT_ADMIN_TOKEN"
        return AdminError(f"{method} {path} needs the admin token: {hint}")
    code = CLUSTER_FAILED if exc.code >= 500 else MISTAKE
    return AdminError(f"{method} {path}: {exc.code} {detail}", errors, code)


def call(
    args: argparse.Namespace,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    base = router_url(args.router)
    request = urllib.request.Request(  # noqa: S310 - the user's router URL
        base + path, data=data, method=method, headers=headers or {}
    )
    request.add_header("Content-Type", "application/json")
    if args.token:
        request.add_header("Authorization", f"Bearer {args.token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        raise _refusal(args, method, path, exc) from exc
    except (urllib.error.URLError, OSError) as exc:
        raise AdminError(f"cannot reach the router at {base}: {exc}", code=CLUSTER_FAILED) from exc


def _print_moves(moves: list[dict[str, Any]], title: str) -> None:
    table = Table(title=title)
    for column in ("source", "target", "keyspace moved", "slots"):
        table.add_column(column)
    total = 0.0
    for move in moves:
        total += move["fraction"]
        slots = move.get("slots") or []
        table.add_row(
            move["source"],
            move["target"],
            f"{move['fraction']:.2%}",
            str(len(slots)) if slots else "-",
        )
    Console().print(table)
    print(f"total moved: {total:.2%} of the keyspace")


def watch(args: argparse.Namespace) -> dict[str, Any]:
    """Follow the migration to its end with a progress bar (keys/s)."""
    final: dict[str, Any] = {}
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[moved]} keys moved, {task.fields[rate]} keys/s"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, disable=args.json, transient=False) as progress:
        task = progress.add_task("migrating", total=None, moved=0, rate=0)
        while True:
            info = call(args, "GET", "/v1/cluster")
            migration = info.get("migration") or {}
            sources = migration.get("sources") or {}
            done = sum(1 for s in sources.values() if s.get("done"))
            progress.update(
                task,
                total=max(len(sources), 1),
                completed=done,
                description=f"migration {migration.get('id', '?')}: {migration.get('phase', '?')}",
                moved=migration.get("keys_moved", 0),
                rate=migration.get("keys_per_s", 0),
            )
            if migration.get("last_error"):
                hint = "fix it, then `shardlimit reshard resume`; or `shardlimit reshard abort`"
                raise AdminError(
                    f"migration paused: {migration['last_error']} ({hint})", code=CLUSTER_FAILED
                )
            if migration.get("phase") == "done" and not migration.get("running"):
                final = {"epoch": info["epoch"], **migration}
                return final
            # Polling the router for progress, at the cadence of /ui: each GET /v1/cluster
            # asks every node for its stats, while the move's live checks wait on them.
            time.sleep(0.5)


def _finish(args: argparse.Namespace, started: Any) -> int:
    if not args.wait:
        print(json.dumps(started) if args.json else f"started: {started}")
        return 0
    final = watch(args)
    if args.json:
        print(json.dumps(final))
    else:
        print(
            f"done: epoch {final['epoch']}, {final.get('keys_moved', 0)} keys moved "
            f"in {final.get('seconds', 0)} s ({final.get('keys_per_s', 0)} keys/s)"
        )
    return 0


def cmd_node_add(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"url": args.url}
    if args.weight is not None:
        body["weight"] = args.weight
    if args.id:
        body["id"] = args.id
    return _finish(args, call(args, "POST", "/v1/cluster/nodes", body))


def cmd_node_remove(args: argparse.Namespace) -> int:
    path = f"/v1/cluster/nodes/{args.node_id}"
    if args.url:
        path += "?" + urlencode({"url": args.url})
    return _finish(args, call(args, "DELETE", path))


def cmd_reshard(args: argparse.Namespace) -> int:
    if args.action == "resume":
        return _finish(args, call(args, "POST", "/v1/cluster/migration/resume"))
    if args.action == "abort":
        return _finish(args, call(args, "POST", "/v1/cluster/migration/abort"))
    if not args.add and not args.remove:
        raise AdminError("reshard plan|apply needs --add URL or --remove ID")
    if args.add:
        body = {"url": args.add, "weight": args.weight, "dry_run": args.action == "plan"}
        if args.id:
            body["id"] = args.id
        answer = call(args, "POST", "/v1/cluster/nodes", body)
    else:
        suffix = "?dry_run=1" if args.action == "plan" else ""
        answer = call(args, "DELETE", f"/v1/cluster/nodes/{args.remove}{suffix}")
    if args.action == "plan":
        if args.json:
            print(json.dumps(answer))
        else:
            _print_moves(answer["moves"], f"plan ({answer['partitioner']})")
            ideal = 1 / len(answer["shares"]) if args.add else None
            if ideal is not None:
                print(f"ideal for an equal-weight node: {ideal:.2%}")
        return 0
    return _finish(args, answer)


NO_WAIT_HELP = "return once the migration starts instead of following it to the end"


def add_arguments(sub: Commands, router_args: Any) -> None:
    node = sub.add_parser("node", help="add or remove a counter node (a live reshard)")
    membership = Commands(node, dest="node_action", required=True, metavar="{add,remove}")
    add = membership.add_parser(
        "add",
        help="add a node by URL and move its keys to it; with the --id of a node already in "
        "the cluster, add another endpoint of that node (no key moves)",
    )
    add.add_argument("url", help="the running node's URL (e.g. http://127.0.0.1:7004)")
    add.add_argument("--id", help="its id (default: the one the node reports)")
    add.add_argument(
        "--weight", type=int, default=None, help="its share of keys, relative (default 1)"
    )
    add.add_argument("--no-wait", dest="wait", action="store_false", help=NO_WAIT_HELP)
    router_args(add)
    remove = membership.add_parser("remove", help="move a node's keys away and remove it")
    remove.add_argument("node_id", help="the id of the node to remove (see `shardlimit status`)")
    remove.add_argument(
        "--url", help="remove only this endpoint of the node (its keys stay on the node)"
    )
    remove.add_argument("--no-wait", dest="wait", action="store_false", help=NO_WAIT_HELP)
    router_args(remove)
    reshard = sub.add_parser("reshard", help="plan|apply|status|resume|abort a reshard")
    reshard.add_argument(
        "action",
        choices=("plan", "apply", "status", "resume", "abort"),
        help="plan: show the moves; apply: run them; status; resume; abort: undo the "
        "migration in progress (back to the previous layout)",
    )
    reshard.add_argument("--add", metavar="URL", help="a node to add")
    reshard.add_argument("--remove", metavar="ID", help="a node to remove")
    reshard.add_argument("--id", help="with --add: the new node's id")
    reshard.add_argument("--weight", type=int, default=1, help="with --add: its weight (default 1)")
    reshard.add_argument("--no-wait", dest="wait", action="store_false", help=NO_WAIT_HELP)
    router_args(reshard)


def run(handler: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        code: int = handler(args)
        return code
    except AdminError as exc:
        print(f"shardlimit: {exc}", file=sys.stderr)
        return exc.code
