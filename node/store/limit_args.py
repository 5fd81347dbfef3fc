"""A limit's script arguments: LIMIT_ARGS ints per limit (its algorithm's code, the amount,
then the algorithm's six parameters), as every counter script reads them
(node/store/lua/common.lua), and their cache per rule."""

from __future__ import annotations

from typing import Any

from cluster.model.algorithms import BY_NAME, LEASE_NONCE_PARAM
from cluster.model.keys import counter_key
from cluster.model.limits import LimitSpec
from node.store.store_op import StoreOp

__all__ = ["LIMIT_ARGS", "Rule", "RuleCache", "limit_args", "op_limit_args"]

# The ints of one limit in a script's arguments: code, amount, p1..p6. A list of limits'
# arguments (a hold entry's "a", node/holds/keeper.py) is a multiple of it.
LIMIT_ARGS = 8

# Algorithms whose script arguments depend on the clock (calendar: period starts).
_CLOCKED = frozenset({BY_NAME["calendar"].code})
_RULES_MAX = 10_000
_ARGS_MAX = 256


def limit_args(spec: LimitSpec, amount: int, now_ms: int, quota_ttl_ms: int = 0) -> list[int]:
    """One limit's LIMIT_ARGS script arguments."""
    algorithm = BY_NAME[spec.algorithm]
    return [algorithm.code, amount, *algorithm.pack(spec, now_ms, quota_ttl_ms)]


def op_limit_args(op: StoreOp, now_ms: int) -> list[int]:
    """The script arguments of each of an op's limits, one after the other."""
    return [
        value
        for spec, amount in zip(op.limits, op.amounts, strict=True)
        for value in limit_args(spec, amount, now_ms, op.quota_ttl_ms)
    ]


class Rule:
    """What a check needs of its scope and limits, worked out once for them: its counter
    keys' prefixes, its algorithm codes, and (unless they depend on the clock) its limits'
    script arguments per (amounts, quota TTL)."""

    __slots__ = ("args", "clocked", "codes", "lease_at", "limits", "prefixes", "single")

    def __init__(self, scope: str, limits: tuple[LimitSpec, ...]) -> None:
        self.limits = limits  # held: the cache is keyed by its id
        self.prefixes = [counter_key(scope, spec.shape, "") for spec in limits]
        self.codes = frozenset(BY_NAME[spec.algorithm].code for spec in limits)
        self.clocked = not self.codes.isdisjoint(_CLOCKED)
        # Where a check's fresh lease nonce goes in its arguments (its concurrency limit's
        # p4; at most one per rule, as they share a shape), else -1.
        self.lease_at = next(
            (
                i * LIMIT_ARGS + 2 + LEASE_NONCE_PARAM
                for i, spec in enumerate(limits)
                if spec.algorithm == "concurrency"
            ),
            -1,
        )
        # The counter key prefix of a one-limit rule whose arguments do not depend on the
        # clock (its checks are packed inline, node/store/script_calls.py), else None.
        alone = len(limits) == 1 and not self.clocked
        self.single = self.prefixes[0] if alone else None
        self.args: dict[tuple[tuple[int, ...], int], list[int]] = {}


class RuleCache:
    """The Rule of each (scope, limits) the checks name."""

    __slots__ = ("by_limits",)

    def __init__(self) -> None:
        # By scope and the id of an op's limits (node/batch/ops.py hands out one tuple per
        # distinct wire form; the Rule holds it, so the id is not reused meanwhile).
        self.by_limits: dict[tuple[str, int], Rule] = {}

    def rule(self, op: StoreOp) -> Rule:
        rule = self.by_limits.get((op.scope, id(op.limits)))
        if rule is None or rule.limits is not op.limits:
            if len(self.by_limits) >= _RULES_MAX:
                self.by_limits.clear()
            rule = self.by_limits[(op.scope, id(op.limits))] = Rule(op.scope, op.limits)
        return rule

    @staticmethod
    def args(rule: Rule, op: StoreOp, now_ms: int, memo: dict[Any, list[int]]) -> list[int]:
        """The script arguments of each of an op's limits, one after the other: kept
        with the rule unless they depend on the clock, else worked out once per batch
        (`memo`: this now_ms)."""
        if rule.clocked:
            memo_key: Any = (id(op.limits), op.amounts, op.quota_ttl_ms)
            cache = memo
        else:
            memo_key = (op.amounts, op.quota_ttl_ms)
            cache = rule.args
        args = cache.get(memo_key)
        if args is None:
            args = op_limit_args(op, now_ms)
            if len(cache) >= _ARGS_MAX and cache is rule.args:
                cache.clear()
            cache[memo_key] = args
        return args
