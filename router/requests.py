"""Client request bodies: parsed and validated in one pass, every problem reported."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import msgspec

from cluster import wire
from cluster.model.errors import FieldError, Problems, did_you_mean
from cluster.model.keys import (
    INLINE_SCOPE,
    MAX_KEY_BYTES,
    REQUEST_ID,
    RULE_NAME,
    RULE_NAME_TEXT,
    request_fingerprint,
)
from cluster.model.limits import (
    MAX_COUNT,
    expired_quotas,
    parse_decimal,
    parse_limits,
    to_minor_units,
)
from cluster.web.problem import Problem
from router.rules.book import Rule, RuleBook, lease_problems, make_rule

MAX_BATCH = 1000
NO_AMOUNT = object()  # a check without "amount" (null is an amount, and a wrong one)
_ZERO = Decimal(0)
_CHECK_FIELDS = {
    *("key", "rule", "limits", "cost", "amount", "request_id", "dry_run"),
    *("on_failure", "durability"),
}
_REFUND_FIELDS = {"key", "rule", "limits", "request_id"}


class CheckRequest(msgspec.Struct, frozen=True):  # built per check: cheaper than a dataclass
    key: str
    rule: Rule
    cost: int
    amounts: tuple[int, ...]
    request_id: str | None
    dry_run: bool
    # With a request_id: what it promises to repeat (cluster/model/keys.py).
    fingerprint: str | None = None

    def to_op(
        self,
        record_ttl_ms: int,
        hold_ms: int = 0,
        batch: tuple[str, str] | None = None,
        quota_ttl_ms: int = 0,
    ) -> wire.Op:
        """The node op; `hold_ms` and `batch` (id, coordinator) for all-or-nothing holds."""
        batch_id, coordinator = batch if batch is not None else (None, None)
        return wire.Op(
            "check",
            self.key,
            self.rule.name,
            self.rule.wire_list or list(self.rule.wire),
            list(self.amounts),
            self.cost,
            self.request_id,
            self.dry_run,
            False,
            record_ttl_ms,
            hold_ms,
            batch_id,
            coordinator,
            quota_ttl_ms=quota_ttl_ms,
            fingerprint=self.fingerprint,
            # a dry run writes nothing: there is nothing for a replica to hold
            durable=self.rule.durability == "replica" and not self.dry_run,
        )


class RefundRequest(msgspec.Struct, frozen=True):
    key: str
    rule: Rule
    request_id: str

    def to_op(self, *, void: bool = False, kind: str = "refund", quota_ttl_ms: int = 0) -> wire.Op:
        """A refund op, or (kind="commit") the op that makes a held decision final."""
        return wire.Op(
            kind,
            self.key,
            self.rule.name,
            list(self.rule.wire),
            [0] * len(self.rule.limits),
            request_id=self.request_id,
            void=void,
            quota_ttl_ms=quota_ttl_ms,
        )


def parse_key(value: Any, path: str, problems: Problems) -> str:
    if not isinstance(value, str) or not value:
        problems.add(path, "is required: a non-empty string")
        return ""
    size = len(value)  # an ASCII key's bytes: nothing to encode
    if not value.isascii():
        try:
            size = len(value.encode())
        except UnicodeEncodeError:  # a header's bytes that are not UTF-8 (surrogateescape)
            problems.add(path, "must be UTF-8 text")
            return ""
    if size > MAX_KEY_BYTES:
        problems.add(path, f"must be at most {MAX_KEY_BYTES} bytes")
        return ""
    return value


def named_rule(name: Any, rules: RuleBook, problems: Problems, having: str) -> Rule | None:
    """The rule `name` names; None after reporting it unknown or missing. `having`: what
    the rule must have, for the error when no name is given ("a quota limit")."""
    rule = rules.get(name) if isinstance(name, str) else None
    if rule is None and isinstance(name, str) and name:
        problems.add("rule", f"unknown rule '{name}'{did_you_mean(name, rules.rules)}")
    elif rule is None:
        problems.add("rule", f"is required: the name of a rule with {having}")
    return rule


# Inline limits repeat from request to request: each distinct document is validated
# once. Keys carry every value's type (True == 1 and 1.0 == 1 in Python, not in JSON).
_INLINE_RULES_MAX = 4096
_inline_rules: dict[tuple[Any, ...], Rule] = {}


def _inline_key(inline: Any, on_failure: Any, durability: Any) -> tuple[Any, ...] | None:
    """A hashable copy of an inline rule's JSON, or None (not a list of flat objects)."""
    if not isinstance(inline, list) or not isinstance(durability, str | None):
        return None
    if not isinstance(on_failure, str | None):
        return None  # an object or a list: not a key, and refused below
    frozen: list[Any] = [on_failure, durability]
    for item in inline:
        if not isinstance(item, dict):
            return None
        for name, value in item.items():
            if not isinstance(value, str | int | float | Decimal | bool | None):
                return None
            frozen.append((name, type(value), value))
        frozen.append(None)  # end of this limit
    return tuple(frozen)


def _resolve_rule(
    body: dict[str, Any], path: str, rules: RuleBook, problems: Problems
) -> Rule | None:
    inline, on_failure = body.get("limits"), body.get("on_failure")
    return rule_of(
        body.get("rule"), inline, on_failure, path, rules, problems, body.get("durability")
    )


def rule_of(
    name: Any,
    inline: Any,
    on_failure: Any,
    path: str,
    rules: RuleBook,
    problems: Problems,
    durability: Any = None,
) -> Rule | None:
    """The named rule, or one made of inline `limits` with their `on_failure` and
    `durability` (refused beside a named rule, which has its own)."""
    if name is not None and inline is not None:
        problems.add(path, "give either 'rule' or 'limits', not both")
        return None
    if name is None and inline is None:
        problems.add(f"{path}rule", "is required (or inline 'limits')")
        return None
    if name is not None:
        if not isinstance(name, str):
            problems.add(f"{path}rule", "must be a rule name")
            return None
        rule = rules.get(name)
        if rule is None:
            problems.add(f"{path}rule", f"unknown rule '{name}'{did_you_mean(name, rules.rules)}")
        for field, value in (("on_failure", on_failure), ("durability", durability)):
            if value is not None:
                problems.add(
                    f"{path}{field}",
                    f"a named rule has its own {field} (set it in the rule); give it only "
                    "with inline 'limits'",
                )
                rule = None
        return rule
    cache_key = _inline_key(inline, on_failure, durability)
    cached = _inline_rules.get(cache_key) if cache_key is not None else None
    if cached is not None:
        return cached
    before = len(problems.errors)
    limits = parse_limits(inline, f"{path}limits", problems)
    if not limits:
        return None
    expired_quotas(limits, f"{path}limits", problems)
    if on_failure is not None and on_failure not in ("allow", "deny"):
        problems.add(f"{path}on_failure", "must be 'allow' or 'deny'")
        return None
    if durability is not None and durability not in ("primary", "replica"):
        problems.add(f"{path}durability", "must be 'primary' or 'replica'")
        return None
    rule = make_rule(INLINE_SCOPE, limits, on_failure, durability=durability)
    if cache_key is not None and len(problems.errors) == before:
        if len(_inline_rules) >= _INLINE_RULES_MAX:
            _inline_rules.clear()
        _inline_rules[cache_key] = rule
    return rule


def _unknown_fields(body: dict[str, Any], allowed: set[str], path: str, problems: Problems) -> None:
    for name in sorted(set(body) - allowed):
        problems.add(f"{path}{name}", "unknown field")


def parse_check(
    body: Any, rules: RuleBook, problems: Problems, path: str = ""
) -> CheckRequest | None:
    """One check; `path` prefixes field paths inside a batch (e.g. "checks[3].")."""
    if not isinstance(body, dict):
        problems.add(path.rstrip(".") or "body", "must be a JSON object")
        return None
    before = len(problems.errors)
    _unknown_fields(body, _CHECK_FIELDS, path, problems)
    key = parse_key(body.get("key"), f"{path}key", problems)
    rule = _resolve_rule(body, path, rules, problems)
    return check_of(
        before,
        key,
        rule,
        body.get("cost", 1),
        body.get("amount", NO_AMOUNT),
        body.get("request_id"),
        body.get("dry_run", False),
        path,
        problems,
    )


def check_of(
    before: int,
    key: str,
    rule: Rule | None,
    cost_raw: Any,
    amount_raw: Any,
    request_id: Any,
    dry_run: Any,
    path: str,
    problems: Problems,
) -> CheckRequest | None:
    """The check from its key, rule and other fields' JSON values; None when a problem
    was reported since `before` (the count of problems when this check began).

    The one core past decoding for both parsers of a check: parse_check here and the
    typed decoder (router/api/check_bodies.py), so a rule about a check lands once."""
    if rule is not None and rule.leases:
        lease_problems(rule, cost_raw, path, problems)
    if (
        rule is not None
        and amount_raw is NO_AMOUNT
        and request_id is None
        and type(cost_raw) is int
        and 0 <= cost_raw <= MAX_COUNT
        and type(dry_run) is bool
        and not problems.errors
    ):
        # The common check (no amount, no request_id), as the rest below would make it.
        return CheckRequest(key, rule, cost_raw, rule_zero_amounts(rule), None, dry_run)
    cost = 0
    if not isinstance(cost_raw, int) or isinstance(cost_raw, bool):
        problems.add(f"{path}cost", "must be a non-negative integer")
    elif not 0 <= cost_raw <= MAX_COUNT:
        problems.add(f"{path}cost", f"must be between 0 and {MAX_COUNT}")
    else:
        cost = cost_raw
    amount: Decimal | None = _ZERO
    if amount_raw is not NO_AMOUNT:
        amount = parse_decimal(amount_raw, f"{path}amount", problems)
        if amount is not None and amount < 0:
            problems.add(f"{path}amount", "must not be negative")
            amount = None
    if request_id is not None and not (
        isinstance(request_id, str) and REQUEST_ID.match(request_id)
    ):
        problems.add(
            f"{path}request_id", "must be 1-128 characters of A-Z a-z 0-9 _ . : @ ~ + = / -"
        )
    if not isinstance(dry_run, bool):
        problems.add(f"{path}dry_run", "must be true or false")
    amounts: tuple[int, ...] = ()
    if rule is not None and amount is not None:
        if amount_raw is NO_AMOUNT:
            amounts = rule_zero_amounts(rule)
        else:
            minors: list[int] = []
            for spec in rule.limits:
                minor = 0
                if spec.algorithm in ("calendar", "quota"):
                    converted = to_minor_units(amount, spec.amount_scale, f"{path}amount", problems)
                    minor = converted or 0
                minors.append(minor)
            amounts = tuple(minors)
    if len(problems.errors) != before or rule is None or amount is None:
        return None
    fingerprint = None
    if request_id is not None:
        inline = list(rule.wire) if rule.name == INLINE_SCOPE else None
        fingerprint = request_fingerprint(rule.name, inline, cost, amount)
    return CheckRequest(key, rule, cost, amounts, request_id, dry_run, fingerprint)


def rule_zero_amounts(rule: Rule) -> tuple[int, ...]:
    """The amounts of a check without `amount`: zero minor units for every limit."""
    return (0,) * len(rule.limits)


def parse_check_batch(
    body: Any, rules: RuleBook, problems: Problems
) -> tuple[list[CheckRequest], bool]:
    """A `/v1/check/batch` body: (checks, all_or_nothing)."""
    if not isinstance(body, dict):
        problems.add("body", "must be a JSON object with 'checks'")
        return [], False
    _unknown_fields(body, {"checks", "all_or_nothing"}, "", problems)
    checks = body.get("checks")
    all_or_nothing = body.get("all_or_nothing", False)
    if not isinstance(all_or_nothing, bool):
        problems.add("all_or_nothing", "must be true or false")
    if not isinstance(checks, list) or not checks:
        problems.add("checks", "must be a non-empty list")
        return [], False
    if len(checks) > MAX_BATCH:
        problems.add("checks", f"must hold at most {MAX_BATCH} checks")
        return [], False
    parsed: list[CheckRequest] = []
    for index, item in enumerate(checks):
        request = parse_check(item, rules, problems, f"checks[{index}].")
        if request is not None:
            parsed.append(request)
            if all_or_nothing is True and request.rule.spread > 1:
                problems.add(
                    f"checks[{index}].rule",
                    "a spread rule cannot be part of an all_or_nothing batch",
                )
    return parsed, bool(all_or_nothing)


def parse_refund(body: Any, rules: RuleBook, problems: Problems) -> RefundRequest | None:
    if not isinstance(body, dict):
        problems.add("body", "must be a JSON object")
        return None
    before = len(problems.errors)
    _unknown_fields(body, _REFUND_FIELDS, "", problems)
    key = parse_key(body.get("key"), "key", problems)
    rule = _resolve_rule(body, "", rules, problems)
    if rule is not None and rule.leases:
        lease_problems(rule, 0, "", problems)  # as its check: inline leases do not exist
    request_id = body.get("request_id")
    if not (isinstance(request_id, str) and REQUEST_ID.match(request_id)):
        problems.add("request_id", "is required: the request_id of the decision to refund")
    if len(problems.errors) != before or rule is None or not isinstance(request_id, str):
        return None
    return RefundRequest(key, rule, request_id)


def rule_name(name: str) -> str:
    """A rule name from a path. Raises Problem."""
    if not RULE_NAME.match(name):
        raise Problem(
            400,
            "validation",
            f"rule names are {RULE_NAME_TEXT}",
            [FieldError("name", "invalid rule name")],
        )
    return name
