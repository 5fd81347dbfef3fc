"""`shardlimit status` and `shardlimit reshard status`: the cluster's nodes as a table and
its migration as readable lines (`--json`: the router's document as it is)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from cluster.cli.admin import call
from cluster.cli.rules_notice import rejection_line

NO_MIGRATION = "no migration in progress"
# Migration fields shown on their own line; any other scalar field is listed as it is.
_SHOWN = {"id", "phase", "running", "epoch", "sources", "keys_moved", "keys_per_s", "seconds"}
_SHOWN |= {"last_error", "blocked"}


def _cell(value: Any, spec: str = "") -> str:
    """A table cell: `-` for what the router could not tell (a down node's keys)."""
    return "-" if value is None else format(value, spec)


def migration_lines(migration: dict[str, Any] | None) -> list[str]:
    """A migration as lines a person reads: phase, progress, each source, the error."""
    if not migration:
        return [NO_MIGRATION]
    state = "running" if migration.get("running") else "not running"
    head = f"migration {migration.get('id', '?')}: {migration.get('phase', '?')} ({state})"
    if migration.get("epoch") is not None:
        head += f", epoch {migration['epoch']}"
    lines = [head]
    moved = f"  keys moved: {migration.get('keys_moved', 0)}"
    moved += f" ({migration.get('keys_per_s', 0)} keys/s"
    moved += f", {migration['seconds']} s)" if migration.get("seconds") is not None else ")"
    lines.append(moved)
    for source, progress in sorted((migration.get("sources") or {}).items()):
        # A router of the release before names no `copying`: its sources were all shown so.
        waiting = progress.get("copying") is False
        done = "done" if progress.get("done") else "waiting" if waiting else "copying"
        counts = f"{progress.get('moved', 0)} moved of {progress.get('scanned', 0)} scanned"
        lines.append(f"  from {source}: {counts}, {done}")
    for name, value in sorted(migration.items()):
        if name not in _SHOWN and not isinstance(value, dict | list):
            lines.append(f"  {name.replace('_', ' ')}: {_cell(value)}")
    blocked = migration.get("blocked")
    if blocked:  # what keeps it from going on, and where
        lines.append(f"  blocked by {blocked.get('node')}: {blocked.get('reason')}")
    if migration.get("last_error"):
        hint = "fix it, then `shardlimit reshard resume`, or `shardlimit reshard abort`"
        lines.append(f"  last error: {migration['last_error']} ({hint})")
    return lines


def finished(migration: dict[str, Any]) -> str | None:
    """One line for a migration that is over (None while it is not)."""
    if migration.get("phase") != "done" or migration.get("running"):
        return None
    moved = f"{migration.get('keys_moved', 0)} keys moved"
    if migration.get("seconds") is not None:
        moved += f" in {migration['seconds']} s ({migration.get('keys_per_s', 0)} keys/s)"
    return (
        f"last migration {migration.get('id', '?')}: done, epoch {migration.get('epoch')}, {moved}"
    )


def redis_cell(redis: dict[str, Any] | None) -> str:
    """The shard's Redis: its primary and live replicas, or why it has none."""
    if not redis:
        return "-"
    if not redis.get("replicated"):
        return f"{redis.get('primary')}, no replicas"
    replicas = redis.get("replicas") or []
    live = sum(1 for replica in replicas if replica.get("up"))
    cell = f"{redis.get('primary')} + {live}/{len(replicas)} replicas up"
    if not live:
        cell += " (NO LIVE REPLICA: replica rules answer degraded)"
    failovers = redis.get("failovers") or 0
    if not failovers:
        return cell
    return cell + f", {failovers} failover{'' if failovers == 1 else 's'} followed"


def unreplicated_line(nodes: list[dict[str, Any]]) -> str | None:
    """Said once under the table rather than in every row: what a shard without replicas
    does with `durability: replica` rules (None when every shard has replicas)."""
    lone = [
        node["id"] for node in nodes if node.get("redis") and not node["redis"].get("replicated")
    ]
    if not lone:
        return None
    shards = ", ".join(lone)
    return f"no replicas on {shards}: `durability: replica` rules are served as `primary` there"


def endpoints_cell(endpoints: list[dict[str, Any]] | None) -> str | None:
    """A shard of several endpoints: one URL a line, `*` before the one this router sends
    to, `(down)` after one marked down (None for a shard of one endpoint: its url says
    it all)."""
    if not endpoints or len(endpoints) < 2:
        return None
    return "\n".join(
        f"{'*' if endpoint.get('active') else ' '} {endpoint.get('url')}"
        + (" (down)" if endpoint.get("state") == "down" else "")
        for endpoint in endpoints
    )


def cmd_status(args: argparse.Namespace) -> int:
    info = call(args, "GET", "/v1/cluster")
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"epoch {info['epoch']} - {info['partitioner']} partitioner")
    for column in ("node", "url", "weight", "state", "keys", "share", "load", "redis"):
        table.add_column(column)
    for node in info["nodes"]:
        share, load = _cell(node.get("share"), ".1%"), _cell(node.get("load_share"), ".1%")
        weight, keys = _cell(node.get("weight")), _cell(node.get("keys"))
        redis = redis_cell(node.get("redis"))
        url = endpoints_cell(node.get("endpoints")) or node["url"]
        table.add_row(node["id"], url, weight, node["state"], keys, share, load, redis)
    Console().print(table)
    unreplicated = unreplicated_line(info["nodes"])
    if unreplicated:
        print(unreplicated, flush=True)
    for node in info["nodes"]:  # degraded answers say it check by check; this says it once
        if node.get("redis_problem"):
            print(f"{node['id']}'s Redis: {node['redis_problem']}", flush=True)
    migration = info.get("migration")
    if migration:
        print(finished(migration) or "\n".join(migration_lines(migration)), flush=True)
    rules_file = rejection_line(call(args, "GET", "/v1/rules").get("file"))
    if rules_file:
        print(rules_file, flush=True)
    return 0


def cmd_reshard_status(args: argparse.Namespace) -> int:
    migration = call(args, "GET", "/v1/cluster").get("migration")
    if args.json:
        print(json.dumps(migration))
    else:
        print("\n".join(migration_lines(migration)))
    return 0
