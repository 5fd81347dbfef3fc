"""`shardlimit quota adjust KEY --rule R (--delta D | --set S) [--amount-delta A |
--amount-set A] [--request-id ID]`: restock a quota through POST /v1/quota/adjust.

Without --request-id one is made up and printed, so the same adjustment can be sent
again safely (it applies once)."""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any

from cluster.cli.admin import AdminError, call
from cluster.cli.command_tree import Commands, Exclusive

# The API's field names as this command's flags, for its error messages.
FLAGS = {
    "key": "KEY",
    "rule": "--rule",
    "request_id": "--request-id",
    "delta": "--delta",
    "set": "--set",
    "delta_amount": "--amount-delta",
    "set_amount": "--amount-set",
}
CHANGES = "--delta N, --set N, --amount-delta A or --amount-set A"


def add_arguments(sub: Commands, router_args: Any) -> None:
    quota = sub.add_parser("quota", help="restock or set a quota counter")
    actions = Commands(quota, dest="quota_action", required=True, metavar="{adjust}")
    adjust = actions.add_parser("adjust", help="restock a quota key (idempotent by request id)")
    adjust.add_argument("key", help="the limit key (e.g. merchant:42)")
    adjust.add_argument("--rule", required=True, help="a rule with a quota limit")
    count = Exclusive(adjust)
    count.add_argument("--delta", type=int, help="add to (or, negative, take from) remaining")
    count.add_argument("--set", type=int, help="set remaining to this count")
    amount = Exclusive(adjust)
    amount.add_argument("--amount-delta", help="add this exact amount to amount_remaining")
    amount.add_argument("--amount-set", help="set amount_remaining to this exact amount")
    adjust.add_argument("--request-id", help="apply once per id (default: a new id)")
    router_args(adjust)


def body_of(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {
        "key": args.key,
        "rule": args.rule,
        "request_id": args.request_id or f"cli-{uuid.uuid4().hex}",
    }
    for option, field in (
        ("delta", "delta"),
        ("set", "set"),
        ("amount_delta", "delta_amount"),
        ("amount_set", "set_amount"),
    ):
        value = getattr(args, option)
        if value is not None:
            body[field] = value
    return body


def _in_flags(error: AdminError) -> AdminError:
    """The router's field errors, each under the flag that set the field."""
    if not error.errors:
        return error
    named = "; ".join(f"{FLAGS.get(field, field)}: {message}" for field, message in error.errors)
    return AdminError(f"quota adjust: {named}", code=error.code)


def cmd_quota(args: argparse.Namespace) -> int:
    body = body_of(args)
    if not set(body) & {"delta", "set", "delta_amount", "set_amount"}:
        raise AdminError(f"quota adjust needs one of {CHANGES}")
    try:
        answer = call(args, "POST", "/v1/quota/adjust", body)
    except AdminError as exc:
        raise _in_flags(exc) from exc
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    parts = [f"{answer['key']} ({answer['rule']})"]
    if answer.get("remaining") is not None:
        parts.append(f"remaining {answer['remaining']} of {answer['limit']}")
    if answer.get("amount_remaining") is not None:
        parts.append(f"amount remaining {answer['amount_remaining']} of {answer['max_amount']}")
    note = " (already applied: nothing changed)" if answer.get("replayed") else ""
    print(", ".join(parts) + f"; request id {answer['request_id']}{note}")
    return 0
