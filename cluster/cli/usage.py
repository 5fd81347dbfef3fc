"""`shardlimit usage KEY --rule R`: what a key has used of each limit of a rule, through
GET /v1/usage (a dry run: it consumes nothing). For a concurrency limit, the leases held
now and when the first of them expires."""

from __future__ import annotations

import argparse
import json
from typing import Any
from urllib.parse import urlencode

from cluster.cli.admin import CLUSTER_FAILED, AdminError, call
from cluster.cli.command_tree import Commands


def add_arguments(sub: Commands, router_args: Any) -> None:
    usage = sub.add_parser("usage", help="a key's use of each limit of a rule (held leases too)")
    usage.add_argument("key", help="the limit key (e.g. tenant:7)")
    usage.add_argument("--rule", required=True, help="the rule's name")
    router_args(usage)


def duration(ms: int) -> str:
    """A wait as a person reads it: seconds to the millisecond under a minute, else whole
    days, hours, minutes and seconds (a month's reset is `24d 14h 12m`, not 2.12472e+06 s)."""
    if ms < 60_000:
        return f"{ms / 1000:g} s"
    days, rest = divmod(ms // 1000, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, seconds = divmod(rest, 60)
    units = ((days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s"))
    return " ".join(f"{value}{unit}" for value, unit in units if value)


def describe(limit: dict[str, Any]) -> str:
    """One line for one limit of the answer: its count and its amount when it has both."""
    algorithm = limit["algorithm"]
    reset = limit.get("reset_after_ms")
    if algorithm == "concurrency":
        line = f"{limit['held']} held of {limit['limit']} ({limit['remaining']} free)"
        if limit["held"] and reset is not None:
            line += f"; the first expires in {duration(reset)} unless renewed"
        return f"{algorithm}: {line}"
    parts = []
    if limit.get("limit") is not None:
        parts.append(f"remaining {limit['remaining']} of {limit['limit']}")
    if limit.get("max_amount") is not None:
        parts.append(f"amount remaining {limit['amount_remaining']} of {limit['max_amount']}")
    line = ", ".join(parts)
    if reset is not None:
        line += f", resets in {duration(reset)}"
    period = f" ({limit['period']})" if limit.get("period") else ""
    return f"{algorithm}{period}: {line}"


def degraded_line(answer: dict[str, Any]) -> str:
    """A degraded answer knows nothing of the key's use: why, in one line."""
    reason = answer.get("degraded_reason") or "no reason given"
    return (
        f"usage of {answer.get('key')} ({answer.get('rule')}) unknown: its node "
        f"{answer.get('node')} could not answer ({reason})"
    )


def cmd_usage(args: argparse.Namespace) -> int:
    query = urlencode({"key": args.key, "rule": args.rule})
    answer = call(args, "GET", f"/v1/usage?{query}")
    if args.json:
        print(json.dumps(answer, indent=2))
    if answer.get("degraded"):
        raise AdminError(degraded_line(answer), code=CLUSTER_FAILED)
    if args.json:
        return 0
    print(f"{answer['key']} ({answer['rule']}) on {answer['node']}")
    for limit in answer["limits"]:
        print("  " + describe(limit))
    return 0
