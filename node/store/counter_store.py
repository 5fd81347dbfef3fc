"""Counter storage: turns operations into EVALSHA calls on this node's Redis."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import msgspec
import orjson
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError

from cluster.model.algorithms import BY_NAME
from cluster.model.keys import (
    DECISION_FENCE_KEY,
    DECISION_PREFIX,
    PENDING_PREFIX,
    adjust_record_key,
    counter_key,
    record_key,
)
from cluster.model.keys import HOLDS_KEY as HOLDS_KEY  # re-exported: tests read the holds set
from cluster.model.limits import LimitSpec
from cluster.wire import (
    Adjusted,
    AdjustStatus,
    Checked,
    Committed,
    Expired,
    LimitRow,
    Refunded,
    RefundStatus,
    Reused,
)
from node.batch.ops import Op
from node.store.resp import RespPipe
from node.store.scripts import read_lua, script_source

# How long a decision record lasts once nothing needs it any more (node/store/lua/decide.lua).
DECISION_TTL_MS = 3_600_000
# One EVALSHA: the script, its KEYS, its ARGV.
ScriptCall = tuple[AsyncScript, list[str], list[int | str | bytes]]


def _ignore(_seconds: float) -> None:
    pass


# Algorithms whose script arguments depend on the clock (calendar: period starts).
_CLOCKED = frozenset({BY_NAME["calendar"].code})
_RULES_MAX = 10_000
_ARGS_MAX = 256


class _Rule:
    """What a check needs of its scope and limits, worked out once for them: its counter
    keys' prefixes, its algorithm codes, and (unless they depend on the clock) its limits'
    script arguments per (amounts, quota TTL)."""

    __slots__ = ("args", "clocked", "codes", "limits", "prefixes", "single")

    def __init__(self, scope: str, limits: tuple[LimitSpec, ...]) -> None:
        self.limits = limits  # held: the cache is keyed by its id
        self.prefixes = [counter_key(scope, spec.shape, "") for spec in limits]
        self.codes = frozenset(BY_NAME[spec.algorithm].code for spec in limits)
        self.clocked = not self.codes.isdisjoint(_CLOCKED)
        # The counter key prefix of a one-limit rule whose arguments do not depend on
        # the clock (its checks are packed without _check_entry), else None.
        self.single = self.prefixes[0] if len(limits) == 1 and not self.clocked else None
        self.args: dict[tuple[tuple[int, ...], int], list[int]] = {}


class CounterStore:
    """Runs a batch of operations as ONE Redis pipeline of script calls."""

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        default_record_ttl_ms: int = 86_400_000,
        raw_pipe: bool = True,
    ) -> None:
        self.client = client
        # Script calls go through a lean pipelined connection (node/store/resp.py) when the
        # client's kind of connection allows it; redis-py's pipeline otherwise (TLS).
        self.pipe = RespPipe.for_client(client) if raw_pipe else None
        self._scripts: dict[tuple[str, tuple[int, ...]], AsyncScript] = {}
        # By scope and the id of an op's limits (node/batch/ops.py hands out one tuple per
        # distinct wire form; the _Rule holds it, so the id is not reused meanwhile).
        self._rules: dict[tuple[str, int], _Rule] = {}
        self._batch_scripts: dict[frozenset[int], AsyncScript] = {}
        self.commit_script = client.register_script(read_lua("commit.lua"))
        self.decide_script = client.register_script(read_lua("decide.lua"))
        self.settled_script = client.register_script(read_lua("settled.lua"))
        self.decision_ttl_ms = DECISION_TTL_MS
        self.default_record_ttl_ms = default_record_ttl_ms
        # Test-mode clock offset, passed to every script; 0 in production.
        self.offset_ms = 0
        # Redis clock minus local clock, for computing calendar bounds close to Redis time.
        self.skew_ms = 0
        # Seconds of each script pipeline, for /metrics (node/health/metrics.py).
        self.on_redis_call: Callable[[float], None] = _ignore

    async def close(self) -> None:
        if self.pipe is not None:
            await self.pipe.close()

    async def measure_skew(self) -> None:
        before = time.time()
        seconds, micros = await self.client.time()
        after = time.time()
        redis_ms = seconds * 1000 + micros // 1000
        self.skew_ms = redis_ms - int((before + after) * 500)

    def _estimated_now_ms(self) -> int:
        return int(time.time() * 1000) + self.skew_ms + self.offset_ms

    def _limit_args(
        self, spec: LimitSpec, amount: int, now_ms: int, quota_ttl_ms: int = 0
    ) -> list[int]:
        """One limit's 8 script arguments: code, amount, p1..p6."""
        algorithm = BY_NAME[spec.algorithm]
        return [algorithm.code, amount, *algorithm.pack(spec, now_ms, quota_ttl_ms)]

    @staticmethod
    def redis_keys(op: Op) -> list[str]:
        """Every Redis key the operation may read or write."""
        keys = [counter_key(op.scope, spec.shape, op.key) for spec in op.limits]
        if op.request_id is not None:
            make = adjust_record_key if op.kind == "adjust" else record_key
            keys.append(make(op.scope, op.request_id, op.key))
        return keys

    def _script(self, entry: str, op: Op) -> AsyncScript:
        return self._script_for(entry, {BY_NAME[spec.algorithm].code for spec in op.limits})

    def _script_for(self, entry: str, algorithm_codes: set[int]) -> AsyncScript:
        codes = tuple(sorted(algorithm_codes))
        script = self._scripts.get((entry, codes))
        if script is None:
            script = self.client.register_script(script_source(entry, codes))
            self._scripts[(entry, codes)] = script
        return script

    def _op_limit_args(self, op: Op, now_ms: int) -> list[list[int]]:
        """The 8 script arguments of each of an op's limits."""
        return [
            self._limit_args(spec, amount, now_ms, op.quota_ttl_ms)
            for spec, amount in zip(op.limits, op.amounts, strict=True)
        ]

    def _rule(self, op: Op) -> _Rule:
        rule = self._rules.get((op.scope, id(op.limits)))
        if rule is None or rule.limits is not op.limits:
            if len(self._rules) >= _RULES_MAX:
                self._rules.clear()
            rule = self._rules[(op.scope, id(op.limits))] = _Rule(op.scope, op.limits)
        return rule

    def _rule_args(self, rule: _Rule, op: Op, now_ms: int, memo: dict[Any, list[int]]) -> list[int]:
        """The 8 script arguments of each of an op's limits, one after the other: kept
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
            args = [value for limit in self._op_limit_args(op, now_ms) for value in limit]
            if len(cache) >= _ARGS_MAX and cache is rule.args:
                cache.clear()
            cache[memo_key] = args
        return args

    def _check_entry(
        self, op: Op, now_ms: int, memo: dict[Any, list[int]]
    ) -> tuple[list[str], list[Any], _Rule]:
        """A check's KEYS and its packed entry for batch.lua, and its rule."""
        rule = self._rules.get((op.scope, id(op.limits)))
        if rule is None or rule.limits is not op.limits:
            rule = self._rule(op)
        key = op.key
        keys = [prefix + key for prefix in rule.prefixes]
        limits = None if rule.clocked else rule.args.get((op.amounts, op.quota_ttl_ms))
        if limits is None:
            limits = self._rule_args(rule, op, now_ms, memo)
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

    def _batch_call(self, checks: list[Op], now_ms: int, deadline_ms: int) -> ScriptCall:
        """ONE EVALSHA for every check of a batch (node/store/lua/batch.lua)."""
        keys: list[str] = []
        entries: list[list[Any]] = []
        codes: frozenset[int] = frozenset()
        # The ops of a batch mostly share their limits: arguments that depend on the
        # clock are packed once per batch (the ops hold their limits meanwhile, so
        # their ids are not reused).
        memo: dict[Any, list[int]] = {}
        rules = self._rules
        last: _Rule | None = None
        for op in checks:
            rule = rules.get((op.scope, id(op.limits)))
            # The common check inline: one limit, its arguments kept, no record.
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
                entries.append([1, op.cost, int(op.dry_run), 0, 0, "", op.fingerprint, 1, *limits])
            else:
                op_keys, entry, rule = self._check_entry(op, now_ms, memo)
                keys += op_keys
                entries.append(entry)
            if rule is not last:
                assert rule is not None
                codes, last = codes | rule.codes, rule
        args: list[int | str | bytes] = [
            self.offset_ms * 1000,
            deadline_ms,
            msgspec.msgpack.encode(entries),
        ]
        script = self._batch_scripts.get(codes)
        if script is None:
            script = self._batch_scripts[codes] = self._script_for("batch.lua", set(codes))
        return script, keys, args

    def _undo_call(self, op: Op, packed: bytes, now_ms: int) -> ScriptCall:
        """undo.lua: take back what a check consumed, as its undo entries say."""
        keys = [counter_key(op.scope, spec.shape, op.key) for spec in op.limits]
        limit_args = [value for limit in self._op_limit_args(op, now_ms) for value in limit]
        has_record = op.request_id is not None
        if op.request_id is not None:
            keys += [record_key(op.scope, op.request_id, op.key), HOLDS_KEY]
        args: list[int | str | bytes] = [
            self.offset_ms * 1000,
            len(op.limits),
            int(has_record),
            *limit_args,
            packed,
        ]
        return self._script("undo.lua", op), keys, args

    def _call(self, op: Op, now_ms: int) -> ScriptCall:
        """The EVALSHA of a refund, a commit or an undo."""
        if op.kind == "undo":
            assert op.undo is not None
            return self._undo_call(op, op.undo, now_ms)
        assert op.request_id is not None
        if op.kind == "adjust":
            return self._adjust_call(op, now_ms)
        record = record_key(op.scope, op.request_id, op.key)
        if op.kind == "commit":
            return self.commit_script, [record, HOLDS_KEY], []
        keys = [record, *(counter_key(op.scope, spec.shape, op.key) for spec in op.limits)]
        limit_args = [value for limit in self._op_limit_args(op, now_ms) for value in limit]
        args: list[int | str | bytes] = [
            self.offset_ms * 1000,
            len(op.limits),
            int(op.void),
            *limit_args,
            0,
        ]
        return self._script("refund.lua", op), keys, args

    def _adjust_call(self, op: Op, now_ms: int) -> ScriptCall:
        """adjust.lua: a quota restock, once per request_id."""
        assert op.request_id is not None and op.adjust is not None
        spec = op.limits[0]
        keys = [
            counter_key(op.scope, spec.shape, op.key),
            adjust_record_key(op.scope, op.request_id, op.key),
        ]
        ttl = op.record_ttl_ms or self.default_record_ttl_ms
        args: list[int | str | bytes] = [
            self.offset_ms * 1000,
            ttl,
            *self._limit_args(spec, 0, now_ms, op.quota_ttl_ms),
            *op.adjust,
        ]
        return self._script("adjust.lua", op), keys, args

    async def decide(self, batch: str, decision: str, holds: Sequence[str] = ()) -> str:
        """Record a batch's decision unless one exists; the decision that stands.
        A "commit" naming its `holds` does not expire before they all reported
        themselves settled (node/store/lua/decide.lua, settled.lua)."""
        keys = [DECISION_PREFIX + batch, PENDING_PREFIX + batch, DECISION_FENCE_KEY]
        args: list[str | int] = [decision, self.decision_ttl_ms]
        if decision == "commit":
            args += holds
        stored = await self.decide_script(keys=keys, args=args)
        return stored.decode() if isinstance(stored, bytes) else str(stored)

    async def settled(self, batch: str, holds: Sequence[str]) -> int:
        """Holds of a batch are settled; how many are still not (-1: this node handed
        its decision records over, node/holds/coordinator_records.py)."""
        keys = [DECISION_PREFIX + batch, PENDING_PREFIX + batch, DECISION_FENCE_KEY]
        left: int = await self.settled_script(keys=keys, args=[self.decision_ttl_ms, *holds])
        return left

    async def run(self, ops: list[Op], deadline_ms: int = 0) -> list[Any]:
        """Raw results in order, from ONE pipeline: one batch.lua call for all checks,
        one call per refund or commit. A script error becomes an exception object in
        its op's slot. A check reaching Redis after `deadline_ms` (real Unix ms, 0 =
        none) is not applied: its raw result is EXPIRED_REPLY."""
        plan = self.plan(ops, deadline_ms)
        return await self.complete(plan, await self._evalsha_all(plan.calls))

    def plan(self, ops: list[Op], deadline_ms: int) -> Plan:
        """The script calls of run()."""
        now_ms = self._estimated_now_ms()
        checks: list[int] = []
        others: list[int] = []
        for i, op in enumerate(ops):
            (checks if op.kind == "check" else others).append(i)
        calls = [self._call(ops[i], now_ms) for i in others]
        if checks:
            checked = ops if not others else [ops[i] for i in checks]
            calls.insert(0, self._batch_call(checked, now_ms, deadline_ms))
        return Plan(ops, deadline_ms, checks, others, calls)

    def send_now(self, plan: Plan, replied: Callable[[list[Any] | Exception], None]) -> bool:
        """The plan's pipeline written at once, without a task; `replied` gets the raw
        replies (or the connection error). False when that cannot be done now (no open
        lean connection: use run())."""
        if self.pipe is None:
            return False
        started = time.perf_counter()

        def timed(outcome: list[Any] | Exception) -> None:
            self.on_redis_call(time.perf_counter() - started)
            replied(outcome)

        return self.pipe.send_now(_commands(plan.calls), timed)

    @staticmethod
    def results_now(plan: Plan, replies: list[Any]) -> list[Any] | None:
        """run()'s results from the plan's replies, or None when some call must be sent
        again first (Redis lost its scripts, or a clock estimate was off): complete()."""
        if any(isinstance(r, NoScriptError) for r in replies):
            return None
        results = _assemble(plan, replies)
        return None if SKEWED_REPLY in results else results

    async def complete(self, plan: Plan, replies: list[Any]) -> list[Any]:
        """run()'s results from the plan's replies, sending again what did not run."""
        replies = await self._resend_missing(plan.calls, replies)
        results = _assemble(plan, replies)
        ops = plan.ops
        skewed = [i for i, r in enumerate(results) if r == SKEWED_REPLY]
        if skewed:
            # Our estimate of Redis time was more than a period off: re-measure, retry those.
            await self.measure_skew()
            retry = await self.run([ops[i] for i in skewed], plan.deadline_ms)
            for i, r in zip(skewed, retry, strict=True):
                results[i] = r
        return results

    async def undo(self, done: list[tuple[Op, Any]]) -> int:
        """Take back checks that consumed (their raw results carry undo entries), in one
        pipeline: the answer to them is going out too late to count. How many."""
        now_ms = self._estimated_now_ms()
        calls: list[ScriptCall] = []
        for op, raw in done:
            packed = undo_entries(op, raw)
            if packed is not None:
                calls.append(self._undo_call(op, packed, now_ms))
        if not calls:
            return 0
        results = await self._evalsha_all(calls)
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            raise failed[0]
        return len(calls)

    async def _evalsha_all(self, calls: list[ScriptCall]) -> list[Any]:
        """One pipeline of EVALSHA calls; results (or error objects) in order."""
        started = time.perf_counter()
        results = await self._evalsha_pipeline(calls)
        self.on_redis_call(time.perf_counter() - started)
        return await self._resend_missing(calls, results)

    async def _resend_missing(self, calls: list[ScriptCall], replies: list[Any]) -> list[Any]:
        """Calls answered NOSCRIPT did not run: load their scripts, send them again."""
        missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if not missing:
            return replies
        # Redis lost its script cache (restart, SCRIPT FLUSH).
        for script in {calls[i][0].sha: calls[i][0] for i in missing}.values():
            await self.client.script_load(script.script)
        retried = await self._evalsha_pipeline([calls[i] for i in missing])
        replies = list(replies)
        for i, r in zip(missing, retried, strict=True):
            replies[i] = r
        return replies

    async def _evalsha_pipeline(self, calls: list[ScriptCall]) -> list[Any]:
        # EVALSHA directly rather than through Script.__call__: a pipeline holding
        # registered scripts first asks Redis SCRIPT EXISTS, an extra round trip
        # per batch. A NOSCRIPT answer is handled by _evalsha_all().
        if self.pipe is not None:
            return await self.pipe.execute(_commands(calls))
        if len(calls) == 1:
            # The common case (a batch of checks only): one command, no pipeline object.
            script, keys, args = calls[0]
            try:
                return [await self.client.evalsha(script.sha, len(keys), *keys, *args)]
            except ResponseError as exc:  # a script error (NOSCRIPT too) goes in its slot
                return [exc]
        pipe = self.client.pipeline(transaction=False)
        for script, keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        results: list[Any] = await pipe.execute(raise_on_error=False)
        return results


class Plan(NamedTuple):
    """A batch's script calls: checks (indexes in ops) go in calls[0], others after."""

    ops: list[Op]
    deadline_ms: int
    checks: list[int]
    others: list[int]
    calls: list[ScriptCall]


def _commands(calls: list[ScriptCall]) -> list[tuple[Any, ...]]:
    # EVALSHA directly: a NOSCRIPT answer is handled by complete().
    return [("EVALSHA", script.sha, len(keys), *keys, *args) for script, keys, args in calls]


def _assemble(plan: Plan, replies: list[Any]) -> list[Any]:
    if not plan.others:  # the common case: checks only, one batch.lua call
        batch = replies[0]
        return [batch] * len(plan.ops) if isinstance(batch, Exception) else list(batch)
    results: list[Any] = [None] * len(plan.ops)
    at = 0
    if plan.checks:
        batch = replies[0]
        at = 1
        for position, i in enumerate(plan.checks):
            results[i] = batch if isinstance(batch, Exception) else batch[position]
    for i, reply in zip(plan.others, replies[at:], strict=True):
        results[i] = reply
    return results


EXPIRED_REPLY = [-1]  # batch.lua: the deadline had passed, nothing applied
SKEWED_REPLY = [-2]  # batch.lua: a calendar period did not contain Redis' clock
REUSED_REPLY = [-3]  # batch.lua: the request_id names another request, nothing applied


def is_expired(raw: Any) -> bool:
    return bool(raw == EXPIRED_REPLY)


def _packed_undo(raw: list[Any]) -> bytes | None:
    """A check reply's trailing undo entries (present when it consumed)."""
    end = 3 + 8 * raw[2]
    extra = raw[end] if len(raw) > end else None
    return extra if isinstance(extra, bytes) else None


def undo_entries(op: Op, raw: Any) -> bytes | None:
    """The packed undo entries of a check that consumed, else None."""
    if op.kind != "check" or not isinstance(raw, list) or len(raw) <= 3:
        return None
    return _packed_undo(raw)


_EXPIRED = Expired()
_REUSED = Reused()


def check_result(raw: list[Any]) -> Checked | Reused | Expired:
    """batch.lua's reply for one check -> its wire result (with its undo entries)."""
    if len(raw) == 1:
        if raw == EXPIRED_REPLY:
            return _EXPIRED
        if raw == REUSED_REPLY:
            return _REUSED
    n = raw[2]
    if n == 1:  # the common case: one limit, its row and perhaps its undo entries
        undo = raw[11] if len(raw) > 11 and isinstance(raw[11], bytes) else None
        return Checked(raw[0] == 1, raw[1] == 1, [LimitRow(*raw[3:11])], undo)
    rows = [LimitRow(*raw[3 + 8 * i : 11 + 8 * i]) for i in range(n)]
    return Checked(raw[0] == 1, raw[1] == 1, rows, _packed_undo(raw))


def commit_result(raw: int) -> Committed:
    return Committed(raw == 1)


def adjust_result(raw: list[int]) -> Adjusted:
    if raw[0] not in (1, 2):
        return Adjusted(AdjustStatus(raw[0]))
    row = LimitRow(1, raw[1], raw[2], raw[3], -1, -1, raw[4], raw[5])
    return Adjusted(AdjustStatus(raw[0]), row)


def refund_result(raw: list[int]) -> Refunded:
    n = raw[1]
    given = [(raw[2 + 2 * i], raw[3 + 2 * i]) for i in range(n)] if raw[0] == 1 else []
    return Refunded(RefundStatus(raw[0]), given)
