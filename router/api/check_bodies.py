"""`/v1/check` and `/v1/check/batch` bodies, decoded straight into typed Structs.

A well-formed body is decoded and validated in one pass by msgspec, then checked for
what a type cannot say (rule known, ranges, request_id pattern) by the full parser's
own core, router/requests.py's `parse_key`, `rule_of` and `check_of`. Any body the
typed decoder refuses, or with any problem, is parsed again by router/requests.py,
which reports every problem with its field path: the fast path only ever accepts
bodies the full parser accepts, with the same result.
"""

from __future__ import annotations

from typing import Any

import msgspec

from cluster import wire
from cluster.model.errors import FieldError, Problems
from cluster.model.limits import MAX_SLIDING_LOG, log_entries
from cluster.web import exact_json
from cluster.web.problem import Problem, invalid
from router.requests import (
    MAX_BATCH,
    NO_AMOUNT,
    CheckRequest,
    check_of,
    parse_check,
    parse_check_batch,
    parse_key,
    rule_of,
)
from router.rules.book import Rule, RuleBook

_ABSENT = msgspec.Raw(b"")


class _Check(msgspec.Struct, forbid_unknown_fields=True):
    key: str
    rule: str | None = None
    # Kept as raw JSON and read as the full parser reads it (exact numbers).
    limits: msgspec.Raw = _ABSENT
    on_failure: msgspec.Raw = _ABSENT
    durability: msgspec.Raw = _ABSENT
    amount: msgspec.Raw = _ABSENT
    cost: int = 1
    request_id: str | None = None
    dry_run: bool = False


class _Batch(msgspec.Struct, forbid_unknown_fields=True):
    checks: list[_Check]
    all_or_nothing: bool = False


_CHECK_DECODER = msgspec.json.Decoder(_Check)
_BATCH_DECODER = msgspec.json.Decoder(_Batch)


def _loads(raw: bytes) -> Any:
    try:
        return exact_json.loads(raw)
    except exact_json.JSONDecodeError as exc:
        raise Problem(400, "malformed-json", f"body is not valid JSON: {exc}") from None


def _raw(value: msgspec.Raw, absent: Any) -> Any:
    """A field kept as its JSON text, read with exact numbers (cluster/web/exact_json.py)."""
    return exact_json.loads(bytes(value)) if value else absent


# Inline limits repeat byte for byte from check to check: each distinct text of
# `limits` and `on_failure` is parsed and validated once. Only short texts are kept: one
# padded with a megabyte of spaces would otherwise keep that megabyte, per variant.
_INLINE_MAX = 4096
_INLINE_TEXT_MAX = 2048
_inline: dict[bytes, Rule] = {}


def _rule(body: _Check, rules: RuleBook, problems: Problems) -> Rule | None:
    if not body.limits or body.rule is not None:
        on_failure, durability = _raw(body.on_failure, None), _raw(body.durability, None)
        return rule_of(
            body.rule, _raw(body.limits, None), on_failure, "", rules, problems, durability
        )
    limits = bytes(body.limits)
    # JSON text holds no NUL byte: the parts cannot run into each other.
    text = limits
    if body.on_failure or body.durability:
        text += b"\0" + bytes(body.on_failure) + b"\0" + bytes(body.durability)
    rule = _inline.get(text)
    if rule is None:
        on_failure, durability = _raw(body.on_failure, None), _raw(body.durability, None)
        inline = exact_json.loads(limits)
        rule = rule_of(None, inline, on_failure, "", rules, problems, durability)
        if rule is not None and not problems.errors and len(text) <= _INLINE_TEXT_MAX:
            if len(_inline) >= _INLINE_MAX:
                _inline.clear()
            _inline[text] = rule
    return rule


def decode_check(raw: bytes, rules: RuleBook) -> CheckRequest:
    """A `/v1/check` body. Raises Problem or ValidationError (every problem)."""
    problems = Problems()
    try:
        body = _CHECK_DECODER.decode(raw)
        # Past decoding, the full parser's own steps (parse_key, rule_of, check_of),
        # written out here rather than in a helper: one call less per check.
        key = parse_key(body.key, "key", problems)
        rule = _rule(body, rules, problems)
        amount = _raw(body.amount, NO_AMOUNT)
        request = check_of(
            0, key, rule, body.cost, amount, body.request_id, body.dry_run, "", problems
        )
    except (*wire.DECODE_ERRORS, exact_json.JSONDecodeError):
        request = None  # the full parser below says what is wrong
    if request is not None:
        return request
    problems = Problems()
    return problems.result(parse_check(_loads(raw), rules, problems))


def decode_check_batch(raw: bytes, rules: RuleBook) -> tuple[list[CheckRequest], bool]:
    """A `/v1/check/batch` body: (checks, all_or_nothing). Raises as decode_check."""
    checks, all_or_nothing = _decode_batch(raw, rules)
    if sum(check.cost for check in checks) > MAX_SLIDING_LOG:  # else the entries fit
        entries = sum(
            0 if check.dry_run else log_entries(check.rule.limits, check.cost) for check in checks
        )
        if entries > MAX_SLIDING_LOG:
            message = (
                f"the checks on sliding_log limits add up to a cost of {entries}: at most "
                f"{MAX_SLIDING_LOG} in one batch, as in one check (such a limit keeps an "
                "entry per unit; sliding_window counts any cost in constant space)"
            )
            raise invalid([FieldError("checks", message)])
    return checks, all_or_nothing


def _decode_batch(raw: bytes, rules: RuleBook) -> tuple[list[CheckRequest], bool]:
    try:
        body = _BATCH_DECODER.decode(raw)
    except wire.DECODE_ERRORS:
        body = None
    if body is not None and 0 < len(body.checks) <= MAX_BATCH:
        problems = Problems()
        checks: list[CheckRequest] = []
        try:
            for item in body.checks:  # each check as decode_check's
                key = parse_key(item.key, "key", problems)
                rule = _rule(item, rules, problems)
                amount = _raw(item.amount, NO_AMOUNT)
                request = check_of(
                    0, key, rule, item.cost, amount, item.request_id, item.dry_run, "", problems
                )
                # parse_check_batch's refusal of a spread rule in an all-or-nothing batch
                if request is None or (body.all_or_nothing and request.rule.spread > 1):
                    break
                checks.append(request)
            else:
                return checks, body.all_or_nothing
        except exact_json.JSONDecodeError:
            pass
    problems = Problems()
    parsed = parse_check_batch(_loads(raw), rules, problems)
    problems.raise_if_any()
    return parsed
