"""`shardlimit rules get|apply`: the cluster's rules as YAML, and a rules file applied
with a diff (PUT /v1/rules, If-Match on the version the diff was made against).

Like `kubectl apply --prune`, applying a file that lacks rules the cluster holds deletes
them only with `--prune`; without it, an interactive terminal is asked, anything else
is refused with the list of rules it would delete, and nothing changes."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from cluster.cli.admin import AdminError, call
from cluster.cli.command_tree import Commands

if TYPE_CHECKING:
    from router.rules.book import Rule


def _live(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    """The cluster's rules version and its rules by name, in their public form."""
    answer = call(args, "GET", "/v1/rules")
    rules = {rule["name"]: _public(rule) for rule in answer["rules"]}
    return int(answer["version"]), rules


def _public(rule: dict[str, Any]) -> dict[str, Any]:
    public = {"limits": rule["limits"], "on_failure": rule["on_failure"]}
    if rule.get("spread", 1) > 1:
        public["spread"] = rule["spread"]
    for flag in ("cache_denials", "shadow"):
        if rule.get(flag):
            public[flag] = True
    return public


def _yaml(rules: dict[str, Any]) -> str:
    return yaml.safe_dump({"rules": rules}, sort_keys=False)


def _from_file(path: Path) -> dict[str, Rule]:
    """A rules file's rules, read and validated as a router reads its own."""
    from router.rules.book import RulesFileError, read_rules_file

    try:
        return read_rules_file(path)
    except RulesFileError as exc:
        raise AdminError(str(exc)) from exc


def _refuse_expired(path: Path, rules: dict[str, Rule]) -> None:
    """What `PUT /v1/rules` refuses besides the document itself (a quota whose
    `expires_at` has passed): the dry run refuses it too."""
    from cluster.model.errors import Problems, ValidationError
    from cluster.model.limits import expired_quotas

    problems = Problems()
    for name, rule in sorted(rules.items()):
        expired_quotas(rule.limits, f"rules.{name}.limits", problems)
    if problems.errors:
        raise AdminError(f"{path}: {ValidationError(problems.errors)}")


def cmd_get(args: argparse.Namespace) -> int:
    version, rules = _live(args)
    if args.json:
        print(json.dumps({"version": version, "rules": rules}))
    else:
        print(f"# rules version {version}")
        print(_yaml(rules), end="")
    return 0


def cmd_apply(args: argparse.Namespace) -> int:
    from router.rules.book import rules_document

    rules = _from_file(args.file)
    wanted = rules_document(rules)
    version, live = _live(args)
    changes = {
        "added": sorted(set(wanted) - set(live)),
        "removed": sorted(set(live) - set(wanted)),
        "changed": sorted(n for n in set(wanted) & set(live) if wanted[n] != live[n]),
    }
    diff = "".join(
        difflib.unified_diff(
            _yaml(live).splitlines(keepends=True),
            _yaml(wanted).splitlines(keepends=True),
            f"cluster (version {version})",
            str(args.file),
        )
    )
    changed = any(changes.values())
    if changed:
        _refuse_expired(args.file, rules)
    applied: int | None = None
    if changes["removed"] and not args.dry_run and not args.prune:
        _confirm_prune(args, changes["removed"], diff)
    if changed and not args.dry_run:
        answer = call(args, "PUT", "/v1/rules", {"rules": wanted}, {"If-Match": f'"{version}"'})
        applied = int(answer["version"])
    if args.json:
        print(
            json.dumps(
                {
                    "from_version": version,
                    "version": applied or version,
                    "applied": applied is not None,
                    "diff": diff,
                    **changes,
                }
            )
        )
        return 0
    if not diff:
        print(f"no changes: the cluster's rules (version {version}) match {args.file}")
    else:
        print(diff, end="")
        summary = ", ".join(f"{len(v)} {k}" for k, v in changes.items() if v)
        if args.dry_run:
            print(f"dry run: {summary}; nothing applied")
        else:
            print(f"applied: {summary}; rules version {version} -> {applied}")
    return 0


def _confirm_prune(args: argparse.Namespace, removed: list[str], diff: str) -> None:
    """Deleting rules needs --prune, or a "y" at an interactive terminal; raises AdminError."""
    listed = ", ".join(removed)
    refusal = (
        f"{args.file} would delete {len(removed)} rule(s) the cluster holds: {listed}; "
        "nothing applied (add --prune to delete them)"
    )
    if args.json or not sys.stdin.isatty():
        raise AdminError(refusal)
    print(diff, end="")
    try:
        answer = input(f"delete {len(removed)} rule(s) ({listed})? [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise AdminError("nothing applied")


def add_arguments(sub: Commands, router_args: Any) -> None:
    rules = sub.add_parser("rules", help="get the cluster's rules, or apply a rules file")
    actions = Commands(rules, dest="rules_action", required=True)
    get = actions.add_parser("get", help="print the live rules as YAML")
    router_args(get)
    apply = actions.add_parser("apply", help="show the diff to a rules file and apply it")
    apply.add_argument("-f", "--file", type=Path, required=True, help="a rules.yaml")
    apply.add_argument("--dry-run", action="store_true", help="show the diff only")
    apply.add_argument(
        "--prune", action="store_true", help="delete rules the cluster holds that the file lacks"
    )
    router_args(apply)


def cmd_rules(args: argparse.Namespace) -> int:
    handler = cmd_get if args.rules_action == "get" else cmd_apply
    return handler(args)
