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
from urllib.parse import quote, urlencode, urlsplit

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cluster.cli.command_tree import Commands, Exclusive
from cluster.model.keys import RULE_NAME, RULE_NAME_TEXT

# Exit statuses (the --help epilog says them): 0 done.
CLUSTER_FAILED = 1  # the cluster could not do it: router unreachable, an HTTP 5xx
MISTAKE = 2  # a mistake in the command or its input: usage, a bad file, an HTTP 4xx
INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports a program it interrupted
# The router's rule for a node id (router/api/node_body.py), said as the router says it.
NODE_ID_RULE = RULE_NAME_TEXT
FOLLOW_HINT = "`shardlimit reshard status` to follow it"


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
    """The router's base URL; `host:port` without a scheme means http://host:port.
    Raises AdminError (a mistake) for anything else than http(s)://host[:port][/path]."""
    given = value
    if not value.strip():
        raise AdminError(
            "--router is empty: give a router URL such as http://127.0.0.1:8080 "
            "(or unset an empty SHARDLIMIT_ROUTER)"
        )
    if "://" not in value:
        value = f"http://{value}"
    scheme = value.split("://", 1)[0].lower()
    if scheme not in ("http", "https"):
        raise AdminError(f"--router must be an http:// or https:// URL, not {given!r}")
    try:
        host = urlsplit(value).hostname
    except ValueError:  # an unclosed [IPv6 address
        host = None
    if not host:
        raise AdminError(f"--router needs a host, as in http://127.0.0.1:8080, not {given!r}")
    try:
        port = urlsplit(value).port
    except ValueError:  # not a number, or past 65535
        port = 0
    if port == 0:
        raise AdminError(f"--router's port must be a number from 1 to 65535, not in {given!r}")
    return value.rstrip("/")


def node_id(value: str) -> str:
    """An argparse type: a node id as the router takes it (a mistake is one line)."""
    if not RULE_NAME.match(value):
        raise argparse.ArgumentTypeError(f"a node id is {NODE_ID_RULE}, not {value!r}")
    return value


def segment(value: str) -> str:
    """`value` as one path segment of a URL (nothing in it starts a query or a path)."""
    return quote(value, safe="")


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


# How long the command line waits for the router: a read, or a change, which may wait
# out another router's lease (twice its TTL, 15 s by default) and then push the topology
# for 20 s before it answers.
READ_TIMEOUT_S = 30.0
CHANGE_TIMEOUT_S = 90.0


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
        timeout = READ_TIMEOUT_S if method == "GET" else CHANGE_TIMEOUT_S
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
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


# Whether a layout (GET /v1/cluster's `nodes`) is the one a command asked for.
Asked = Callable[[list[dict[str, Any]]], bool]


def _urls(node: dict[str, Any]) -> set[str]:
    endpoints = node.get("endpoints") or []
    return {str(node.get("url"))} | {str(e.get("url")) for e in endpoints}


def with_url(url: str) -> Asked:
    """The layout has a node (or an endpoint of one) at `url`."""
    return lambda nodes: any(url.rstrip("/") in _urls(node) for node in nodes)


def without(node_id: str, url: str | None = None) -> Asked:
    """The layout has no node `node_id` (with `url`: that node has no endpoint `url`)."""
    if url is None:
        return lambda nodes: all(node.get("id") != node_id for node in nodes)
    return lambda nodes: all(
        node.get("id") != node_id or url.rstrip("/") not in _urls(node) for node in nodes
    )


def outcome(followed: str, info: dict[str, Any], asked: Asked | None) -> str:
    """Where migration `followed` stands in GET /v1/cluster's answer `info`: "going",
    "done", "paused" (it stopped on an error) or "undone" (aborted, or over without the
    layout `asked` for). Once another migration than `followed` (or none) is current,
    `followed` is over, and only the layout tells how."""
    migration = info.get("migration") or {}
    if migration.get("reverts") == followed:
        return "undone"
    if migration.get("id") == followed:
        if migration.get("last_error"):
            return "paused"
        if migration.get("phase") != "done" or migration.get("running"):
            return "going"
    if asked is None or asked(info.get("nodes") or []):
        return "done"
    return "undone"


def watch(args: argparse.Namespace, followed: str, asked: Asked | None = None) -> dict[str, Any]:
    """Follow migration `followed` to its end with a progress bar (keys/s); its summary
    when it is done. Raises AdminError when it pauses, is undone or the user stops
    following it (Ctrl-C: it goes on in the cluster)."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[moved]} keys moved, {task.fields[rate]} keys/s"),
        TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, disable=args.json, transient=False) as progress:
            task = progress.add_task("migrating", total=None, moved=0, rate=0)
            while True:
                info = call(args, "GET", "/v1/cluster")
                migration = info.get("migration") or {}
                state = outcome(followed, info, asked)
                if migration.get("id") == followed:
                    sources = migration.get("sources") or {}
                    done = sum(1 for s in sources.values() if s.get("done"))
                    progress.update(
                        task,
                        total=max(len(sources), 1),
                        completed=done,
                        description=f"migration {followed}: {migration.get('phase', '?')}",
                        moved=migration.get("keys_moved", 0),
                        rate=migration.get("keys_per_s", 0),
                    )
                if state == "paused":
                    hint = "fix it, then `shardlimit reshard resume`; or `shardlimit reshard abort`"
                    raise AdminError(
                        f"migration paused: {migration['last_error']} ({hint})",
                        code=CLUSTER_FAILED,
                    )
                if state == "undone":
                    raise AdminError(_undone(followed, migration), code=CLUSTER_FAILED)
                if state == "done":
                    if migration.get("id") != followed:  # over, and another one since
                        return {"epoch": info["epoch"], "id": followed}
                    return {"epoch": info["epoch"], **migration}
                # Polling the router for progress, at the cadence of /ui: each GET
                # /v1/cluster asks every node for its stats, while the move's live checks
                # wait on them.
                time.sleep(0.5)
    except KeyboardInterrupt:
        raise AdminError(
            f"stopped following migration {followed}: it goes on in the cluster ({FOLLOW_HINT})",
            code=INTERRUPTED,
        ) from None


def _undone(followed: str, migration: dict[str, Any]) -> str:
    if migration.get("reverts") == followed:
        back = f"migration {migration.get('id')} returns to the previous layout"
        return f"migration {followed} was aborted ({back}): the change was not made"
    return (
        f"migration {followed} was aborted: the cluster is not in the layout asked for "
        "(see `shardlimit status`)"
    )


def _started_line(started: dict[str, Any]) -> str:
    line = f"started: migration {started.get('migration')}"
    if started.get("reverts"):
        line += f", undoing migration {started['reverts']}"
    if started.get("epoch") is not None:
        line += f", epoch {started['epoch']}"
    moves = started.get("moves")
    if isinstance(moves, list):
        line += f", {len(moves)} move{'' if len(moves) == 1 else 's'}"
    return f"{line} ({FOLLOW_HINT})"


def _finish(args: argparse.Namespace, started: Any, asked: Asked | None = None) -> int:
    if not args.wait:
        print(json.dumps(started) if args.json else _started_line(started))
        return 0
    final = watch(args, str(started["migration"]), asked)
    if args.json:
        print(json.dumps(final))
    elif "keys_moved" not in final:
        print(f"done: epoch {final['epoch']}")
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
    return _finish(args, call(args, "POST", "/v1/cluster/nodes", body), with_url(args.url))


def cmd_node_remove(args: argparse.Namespace) -> int:
    path = f"/v1/cluster/nodes/{segment(args.node_id)}"
    if args.url:
        path += "?" + urlencode({"url": args.url})
    return _finish(args, call(args, "DELETE", path), without(args.node_id, args.url))


def cmd_reshard(args: argparse.Namespace) -> int:
    if args.action == "resume":
        return _finish(args, call(args, "POST", "/v1/cluster/migration/resume"))
    if args.action == "abort":
        return _finish(args, call(args, "POST", "/v1/cluster/migration/abort"))
    if not args.add and not args.remove:
        raise AdminError("reshard plan|apply needs --add URL or --remove ID")
    asked: Asked
    if args.add:
        body = {"url": args.add, "weight": args.weight, "dry_run": args.action == "plan"}
        if args.id:
            body["id"] = args.id
        answer = call(args, "POST", "/v1/cluster/nodes", body)
        asked = with_url(args.add)
    else:
        path = f"/v1/cluster/nodes/{segment(args.remove)}"
        if args.action == "plan":
            path += "?" + urlencode({"dry_run": 1})
        answer = call(args, "DELETE", path)
        asked = without(args.remove)
    if args.action == "plan":
        if not isinstance(answer, dict) or answer.get("dry_run") is not True:
            raise AdminError("the router did not answer with a plan", code=CLUSTER_FAILED)
        if args.json:
            print(json.dumps(answer))
        else:
            _print_moves(answer["moves"], f"plan ({answer['partitioner']})")
            ideal = 1 / len(answer["shares"]) if args.add else None
            if ideal is not None:
                print(f"ideal for an equal-weight node: {ideal:.2%}")
            refused = answer.get("refused")
            if isinstance(refused, dict):
                print(
                    f"applied now, this would be refused ({refused.get('status')}): "
                    f"{refused.get('detail')}"
                )
        return 0
    return _finish(args, answer, asked)


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
    add.add_argument("--id", type=node_id, help="its id (default: the one the node reports)")
    add.add_argument(
        "--weight", type=int, default=None, help="its share of keys, relative (default 1)"
    )
    add.add_argument("--no-wait", dest="wait", action="store_false", help=NO_WAIT_HELP)
    router_args(add)
    remove = membership.add_parser("remove", help="move a node's keys away and remove it")
    remove.add_argument(
        "node_id",
        type=node_id,
        metavar="ID",
        help="the id of the node to remove (see `shardlimit status`)",
    )
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
    change = Exclusive(reshard)
    change.add_argument("--add", metavar="URL", help="a node to add")
    change.add_argument("--remove", metavar="ID", type=node_id, help="a node to remove")
    reshard.add_argument("--id", type=node_id, help="with --add: the new node's id")
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
