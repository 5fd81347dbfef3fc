"""POST /v1/quota/adjust: restock a `quota` counter, or set what it has left.

Body: `key`, `rule` (a named rule with a quota limit), `request_id`, and at least one
of `delta` | `set` (the count: remaining += delta, or remaining = set) and
`delta_amount` | `set_amount` (the amount, an exact decimal). Remaining never goes
below 0. The same request_id applies once (its first answer is replayed); reused with
another adjustment it is refused (409 request-id-reused). On a `spread: N` rule every
sub-counter gets its share of the delta or the set value (router/rules/spread_split.py), each
applied once by request_id, so a retry after a partial failure completes it exactly.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from cluster import wire
from cluster.model import answers
from cluster.model.errors import Problems
from cluster.model.keys import REQUEST_ID, sub_key
from cluster.model.limits import (
    MAX_AMOUNT_MINOR,
    MAX_COUNT,
    LimitSpec,
    format_amount,
    parse_decimal,
    to_minor_units,
)
from router.channel.outcomes import result_failure
from router.control.cluster_view import ClusterView
from router.errors import AdjustRefused
from router.requests import named_rule, parse_key
from router.rules.book import Rule, RuleBook
from router.rules.spread_split import share

FIELDS = {"key", "rule", "request_id", "delta", "set", "delta_amount", "set_amount"}
NONE, DELTA, SET = 0, 1, 2


class AdjustRequest(msgspec.Struct, frozen=True):
    key: str
    rule: Rule
    index: int  # the quota limit's place in the rule
    count: tuple[int, int]  # (mode, value)
    amount: tuple[int, int]  # (mode, value in minor units)
    request_id: str

    @property
    def spec(self) -> LimitSpec:
        return self.rule.limits[self.index]


def _count(body: dict[str, Any], problems: Problems) -> tuple[int, int]:
    for mode, name, low in ((DELTA, "delta", -MAX_COUNT), (SET, "set", 0)):
        if name in body:
            value = body[name]
            if (
                not isinstance(value, int)
                or isinstance(value, bool)
                or not low <= value <= MAX_COUNT
            ):
                problems.add(name, f"must be an integer from {low} to {MAX_COUNT}")
                return NONE, 0
            return mode, int(value)
    return NONE, 0


def _amount(body: dict[str, Any], scale: int, problems: Problems) -> tuple[int, int]:
    for mode, name in ((DELTA, "delta_amount"), (SET, "set_amount")):
        if name in body:
            number = parse_decimal(body[name], name, problems)
            if number is None:
                return NONE, 0
            minor = to_minor_units(abs(number), scale, name, problems)
            if minor is None:
                return NONE, 0
            if number < 0 and mode == SET:
                problems.add(name, "must not be negative")
                return NONE, 0
            return mode, -minor if number < 0 else minor
    return NONE, 0


def parse_adjust(body: Any, rules: RuleBook, problems: Problems) -> AdjustRequest | None:
    if not isinstance(body, dict):
        problems.add("body", "must be a JSON object")
        return None
    before = len(problems.errors)
    for name in sorted(set(body) - FIELDS):
        problems.add(name, "unknown field")
    key = parse_key(body.get("key"), "key", problems)
    request_id = body.get("request_id")
    if not (isinstance(request_id, str) and REQUEST_ID.match(request_id)):
        problems.add("request_id", "is required: 1-128 characters of A-Z a-z 0-9 _ . : @ ~ + = / -")
    for first, second in (("delta", "set"), ("delta_amount", "set_amount")):
        if first in body and second in body:
            problems.add(second, f"give either '{first}' or '{second}', not both")
    if not FIELDS & set(body) - {"key", "rule", "request_id"}:
        problems.add("body", "needs delta or set, delta_amount or set_amount (or both)")
    rule = named_rule(body.get("rule"), rules, problems, "a quota limit")
    index = -1
    if rule is not None:
        index = next((i for i, s in enumerate(rule.limits) if s.algorithm == "quota"), -1)
        if index < 0:
            problems.add("rule", f"rule '{rule.name}' has no quota limit to adjust")
    count, amount = (NONE, 0), (NONE, 0)
    if rule is not None and index >= 0:
        spec = rule.limits[index]
        count = _count(body, problems)
        amount = _amount(body, spec.amount_scale, problems)
        if count[0] != NONE and spec.limit is None:
            problems.add("delta" if "delta" in body else "set", "the quota has no count limit")
        if amount[0] != NONE and spec.max_amount is None:
            field = "delta_amount" if "delta_amount" in body else "set_amount"
            problems.add(field, "the quota has no max_amount")
        if abs(amount[1]) > MAX_AMOUNT_MINOR:
            problems.add("delta_amount", "is too large")
    if len(problems.errors) != before or rule is None or not isinstance(request_id, str):
        return None
    return AdjustRequest(key, rule, index, count, amount, request_id)


def _ops(request: AdjustRequest, record_ttl_ms: int, quota_ttl_ms: int) -> list[wire.Op]:
    """One adjust op per counter: the key itself, or each sub-counter with its share."""
    rule, n = request.rule, request.rule.spread
    (count_mode, count), (amount_mode, amount) = request.count, request.amount
    targets: list[tuple[str, list[Any], int, int]] = []
    if n == 1:
        targets.append((request.key, rule.wire[request.index], count, amount))
    else:
        for i in range(n):
            limit = rule.sub_wires[i][request.index]
            targets.append(
                (sub_key(request.key, i), limit, share(count, n, i), share(amount, n, i))
            )
    return [
        wire.Op(
            "adjust",
            key,
            rule.name,
            [limit],
            [0],
            request_id=request.request_id,
            record_ttl_ms=record_ttl_ms,
            quota_ttl_ms=quota_ttl_ms,
            adjust=[count_mode, c, amount_mode, a],
        )
        for key, limit, c, a in targets
    ]


async def run_adjust(
    view: ClusterView, request: AdjustRequest, record_ttl_ms: int, quota_ttl_ms: int
) -> answers.QuotaAdjusted:
    """The adjusted quota's body. Raises NodeUnavailable (nothing lost: sending the same
    request again completes it) or AdjustRefused."""
    ops = _ops(request, record_ttl_ms, quota_ttl_ms)
    outcomes = await asyncio.gather(*(view.execute(op.key, op) for op in ops))
    results = [result for _node, result in outcomes]
    for result in results:
        if isinstance(result, wire.Failed) and result.refused:
            raise result_failure(result)
        if not isinstance(result, wire.Adjusted):
            detail = result.detail if isinstance(result, wire.Failed) else repr(result)
            raise AdjustRefused("error", detail)
        if result.status == wire.AdjustStatus.REQUEST_ID_REUSED:
            raise AdjustRefused(
                "request-id-reused",
                f"request_id {request.request_id!r} was already used for another adjustment "
                f"(or a check) of key {request.key!r}",
            )
        if result.status == wire.AdjustStatus.EXPIRED:
            raise AdjustRefused("quota-over", "the quota has expired (expires_at passed)")
    rows = [result.row for result in results if isinstance(result, wire.Adjusted)]
    spec = request.spec

    def total(values: list[int]) -> int | None:
        return None if values[0] == -1 else sum(values)

    def money(values: list[int]) -> str | None:
        summed = total(values)
        return None if summed is None else format_amount(summed, spec.amount_scale)

    first = rows[0]
    return answers.QuotaAdjusted(
        key=request.key,
        rule=request.rule.name,
        request_id=request.request_id,
        replayed=all(
            r.status == wire.AdjustStatus.REPLAYED for r in results if isinstance(r, wire.Adjusted)
        ),
        limit=total([r.limit for r in rows if r is not None]),
        remaining=total([r.remaining for r in rows if r is not None]),
        max_amount=money([r.max_amount for r in rows if r is not None]),
        amount_remaining=money([r.amount_remaining for r in rows if r is not None]),
        reset_after_ms=None if first is None or first.reset_after_ms < 0 else first.reset_after_ms,
    )
