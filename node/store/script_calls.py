"""Ops -> the EVALSHA calls that run them: one batch.lua call for every check, renewal
and release of a batch, one call per refund, commit, undo or adjust. Both ways of sending
them (the lean pipe, node/store/resp.py, and redis-py's pipeline,
node/store/redispy_pipe.py) send what `evalsha_commands` makes of them.

Every call ends with the shard's epoch fence: SHARD_EPOCH_KEY as its last KEY and the
topology epoch its ops were placed by as its last ARGV (node/store/lua/common.lua
`fenced`). NO_FENCE passes any fence: for taking back what this node applied itself."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple

import msgspec
import orjson
from redis.commands.core import AsyncScript

from cluster.model.algorithms import BY_NAME
from cluster.model.keys import (
    HOLDS_KEY,
    SHARD_EPOCH_KEY,
    adjust_record_key,
    counter_key,
    record_key,
)
from cluster.model.limits import log_entries
from cluster.wire import OpKind
from node.store.limit_args import LIMIT_ARGS, Rule, RuleCache, limit_args, op_limit_args
from node.store.nonces import Nonces
from node.store.scripts import ScriptBook, evalsha
from node.store.store_op import StoreOp

__all__ = ["CHECK", "NO_FENCE", "Plan", "ScriptCall", "ScriptCalls", "evalsha_commands"]

# One EVALSHA: the script, its KEYS, its ARGV.
ScriptCall = tuple[AsyncScript, list[str], list[int | str | bytes]]
# A global name is cheaper to reach than an enum attribute (`op.kind is CHECK`).
CHECK: Final = OpKind.CHECK
RELEASE: Final = OpKind.RELEASE
NO_FENCE: Final = 2**53 - 1  # an epoch no fence is newer than (Lua's numbers hold it exactly)


class Plan(NamedTuple):
    """A batch's script calls: checks, renewals and releases (`batched`, indexes in ops)
    go in the first calls (one per group, most often one), each other op in one call
    after."""

    ops: Sequence[StoreOp]
    deadline_ms: int
    epoch: int  # the topology epoch the ops were placed by (the shard's fence)
    batched: list[list[int]]
    others: list[int]
    calls: list[ScriptCall]


# The sliding_log entries one batch.lua call may add. Such a limit keeps a sorted-set
# member per unit admitted, so a call's work grows with its checks' costs; past this
# many, a batch's checks are split over several calls, and Redis serves other clients
# between them (and each call past the batch's deadline applies nothing).
LOG_UNITS_PER_CALL = 20_000


def split_by_log_units(ops: Sequence[StoreOp], batched: list[int]) -> list[list[int]]:
    """`batched` in groups adding at most LOG_UNITS_PER_CALL sliding_log entries each (a
    single op over it alone), in order."""
    groups: list[list[int]] = [[]]
    units = 0
    for i in batched:
        op = ops[i]
        weight = 0 if op.cost <= 1 or op.dry_run else log_entries(op.limits, op.cost)
        if units + weight > LOG_UNITS_PER_CALL and groups[-1]:
            groups.append([])
            units = 0
        groups[-1].append(i)
        units += weight
    return groups


def evalsha_commands(calls: list[ScriptCall]) -> list[tuple[Any, ...]]:
    return [evalsha(script, keys, args) for script, keys, args in calls]


def _held_entry(op: StoreOp, limit_args: list[int]) -> list[Any]:
    """A renewal's or release's entry for batch.lua (concurrency.lua's `held`: one lease
    of its op's one concurrency limit, whose LIMIT_ARGS are `limit_args`)."""
    assert op.lease is not None
    fencing, nonce, ttl_ms = op.lease
    code, _amount, _limit, lease_ms, keep_ms = limit_args[:5]
    action = 1 if op.kind is RELEASE else 2
    return [-1, code, action, f"{fencing}:{nonce}", ttl_ms or lease_ms, keep_ms]


class ScriptCalls:
    """Builds the script calls of ops, with what it keeps to build them fast: each
    rule's keys and arguments, and the scripts registered per algorithm set."""

    def __init__(self, scripts: ScriptBook, default_record_ttl_ms: int) -> None:
        self.scripts = scripts
        self.rules = RuleCache()
        self.nonces = Nonces()
        self.default_record_ttl_ms = default_record_ttl_ms
        # Test-mode clock offset, passed to every script; 0 in production.
        self.offset_ms = 0
        self._batch_scripts: dict[frozenset[int], AsyncScript] = {}
        # The call of each kind of op but a check (the checks of a batch share one call).
        self.by_kind: dict[OpKind, Callable[[StoreOp, int, int], ScriptCall]] = {
            OpKind.REFUND: self._refund_call,
            OpKind.COMMIT: self._commit_call,
            OpKind.UNDO: self._undo_op_call,
            OpKind.ADJUST: self._adjust_call,
        }

    def batch_call(
        self, ops: Sequence[StoreOp], now_ms: int, deadline_ms: int, epoch: int
    ) -> ScriptCall:
        """ONE EVALSHA for every check, renewal and release of a batch
        (node/store/lua/batch.lua), placed by topology `epoch`."""
        keys: list[str] = []
        entries: list[list[Any]] = []
        codes: frozenset[int] = frozenset()
        # The ops of a batch mostly share their limits: arguments that depend on the
        # clock are packed once per batch (the ops hold their limits meanwhile, so
        # their ids are not reused).
        memo: dict[Any, list[int]] = {}
        rules = self.rules.by_limits
        last: Rule | None = None
        for op in ops:
            rule = rules.get((op.scope, id(op.limits)))
            # The common op inline: one limit, its arguments kept, no record (a renewal or
            # release is of one limit, and never has one).
            limits = (
                rule.args.get((op.amounts, op.quota_ttl_ms))
                if rule is not None
                and rule.limits is op.limits
                and rule.single is not None
                and op.request_id is None
                else None
            )
            if limits is not None:
                assert rule is not None and rule.single is not None
                keys.append(rule.single + op.key)
                if op.kind is CHECK:
                    entry = [1, op.cost, int(op.dry_run), 0, 0, "", op.fingerprint, 1, *limits]
                    if rule.lease_at >= 0:
                        entry[8 + rule.lease_at] = self.nonces.draw()
                else:
                    entry = _held_entry(op, limits)
                entries.append(entry)
            else:
                make = self._check_entry if op.kind is CHECK else self._lease_entry
                op_keys, entry, rule = make(op, now_ms, memo)
                keys += op_keys
                entries.append(entry)
            if rule is not last:
                assert rule is not None
                codes, last = codes | rule.codes, rule
        keys.append(SHARD_EPOCH_KEY)
        args: list[int | str | bytes] = [
            self.offset_ms * 1000,
            deadline_ms,
            msgspec.msgpack.encode(entries),
            epoch,
        ]
        script = self._batch_scripts.get(codes)
        if script is None:
            script = self._batch_scripts[codes] = self.scripts.assembled("batch.lua", codes)
        return script, keys, args

    def _check_entry(
        self, op: StoreOp, now_ms: int, memo: dict[Any, list[int]]
    ) -> tuple[list[str], list[Any], Rule]:
        """A check's KEYS and its packed entry for batch.lua, and its rule."""
        rule = self.rules.by_limits.get((op.scope, id(op.limits)))
        if rule is None or rule.limits is not op.limits:
            rule = self.rules.rule(op)
        key = op.key
        keys = [prefix + key for prefix in rule.prefixes]
        limits = None if rule.clocked else rule.args.get((op.amounts, op.quota_ttl_ms))
        if limits is None:
            limits = self.rules.args(rule, op, now_ms, memo)
        if rule.lease_at >= 0:
            # A concurrency limit: each check draws the nonce of the lease it may acquire.
            limits = list(limits)
            limits[rule.lease_at] = self.nonces.draw()
        ttl, hold_ms, entry = 0, 0, ""
        if op.request_id is not None:
            keys.append(record_key(op.scope, op.request_id, op.key))
            ttl = op.record_ttl_ms or self.default_record_ttl_ms
            if op.hold_ms:
                # What the sweeper needs to give the decision back: its refund call.
                hold: dict[str, Any] = {"k": [keys[-1], *keys[:-1]], "a": limits}
                if op.batch is not None:
                    hold["b"], hold["c"] = op.batch, op.coordinator
                hold_ms, entry = op.hold_ms, orjson.dumps(hold).decode()
                keys.append(HOLDS_KEY)
        nkeys, cost, dry_run, fingerprint, n = (
            len(keys),
            op.cost,
            int(op.dry_run),
            op.fingerprint,
            len(op.limits),
        )
        return keys, [nkeys, cost, dry_run, ttl, hold_ms, entry, fingerprint, n, *limits], rule

    def _script(self, entry: str, op: StoreOp) -> AsyncScript:
        return self.scripts.assembled(entry, {BY_NAME[spec.algorithm].code for spec in op.limits})

    def undo_call(self, op: StoreOp, packed: bytes, now_ms: int, epoch: int) -> ScriptCall:
        """undo.lua: take back what a check consumed, as its undo entries say."""
        keys = [counter_key(op.scope, spec.shape, op.key) for spec in op.limits]
        has_record = op.request_id is not None
        if op.request_id is not None:
            keys += [record_key(op.scope, op.request_id, op.key), HOLDS_KEY]
        keys.append(SHARD_EPOCH_KEY)
        args: list[int | str | bytes] = [
            self.offset_ms * 1000,
            len(op.limits),
            int(has_record),
            *op_limit_args(op, now_ms),
            packed,
            epoch,
        ]
        return self._script("undo.lua", op), keys, args

    def _undo_op_call(self, op: StoreOp, now_ms: int, epoch: int) -> ScriptCall:
        assert op.undo is not None
        return self.undo_call(op, op.undo, now_ms, epoch)

    def commit_call(self, record: str, epoch: int) -> ScriptCall:
        """commit.lua: a held decision (its record key) made final."""
        return self.scripts.commit, [record, HOLDS_KEY, SHARD_EPOCH_KEY], [epoch]

    def _commit_call(self, op: StoreOp, _now_ms: int, epoch: int) -> ScriptCall:
        assert op.request_id is not None
        return self.commit_call(record_key(op.scope, op.request_id, op.key), epoch)

    def _refund_call(self, op: StoreOp, now_ms: int, epoch: int) -> ScriptCall:
        assert op.request_id is not None
        keys = [
            record_key(op.scope, op.request_id, op.key),
            *(counter_key(op.scope, spec.shape, op.key) for spec in op.limits),
        ]
        limit_args = op_limit_args(op, now_ms)
        return self.refund_call(keys, limit_args, void=op.void, only_held=False, epoch=epoch)

    def refund_call(
        self, keys: list[str], limit_args: list[int], *, void: bool, only_held: bool, epoch: int
    ) -> ScriptCall:
        """refund.lua on a record (keys[0]) and its counters; `limit_args` holds
        LIMIT_ARGS ints per counter."""
        args: list[int | str | bytes] = [
            self.offset_ms * 1000,
            len(limit_args) // LIMIT_ARGS,
            int(void),
            *limit_args,
            int(only_held),
            epoch,
        ]
        script = self.scripts.assembled("refund.lua", limit_args[0::LIMIT_ARGS])
        return script, [*keys, SHARD_EPOCH_KEY], args

    def _adjust_call(self, op: StoreOp, now_ms: int, epoch: int) -> ScriptCall:
        """adjust.lua: a quota restock, once per request_id."""
        assert op.request_id is not None and op.adjust is not None
        spec = op.limits[0]
        keys = [
            counter_key(op.scope, spec.shape, op.key),
            adjust_record_key(op.scope, op.request_id, op.key),
            SHARD_EPOCH_KEY,
        ]
        ttl = op.record_ttl_ms or self.default_record_ttl_ms
        args: list[int | str | bytes] = [
            self.offset_ms * 1000,
            ttl,
            *limit_args(spec, 0, now_ms, op.quota_ttl_ms),
            *op.adjust,
            epoch,
        ]
        return self._script("adjust.lua", op), keys, args

    def _lease_entry(
        self, op: StoreOp, now_ms: int, memo: dict[Any, list[int]]
    ) -> tuple[list[str], list[Any], Rule]:
        """A renewal's or release's KEYS and its entry for batch.lua, and its rule."""
        rule = self.rules.rule(op)
        entry = _held_entry(op, self.rules.args(rule, op, now_ms, memo))
        return [rule.prefixes[0] + op.key], entry, rule
