"""CounterStore: the node's one door to its Redis. It runs a batch of ops as ONE pipeline
of script calls (node/store/script_calls.py builds them, node/store/replies.py reads the
replies), through the lean pipe (node/store/resp.py) or redis-py's (node/store/redispy_pipe.py,
over TLS): one core, two ways of sending."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

from cluster.model.keys import (
    DECISION_FENCE_KEY,
    DECISION_PREFIX,
    PENDING_PREFIX,
    adjust_record_key,
    counter_key,
    record_key,
)
from cluster.model.keys import HOLDS_KEY as HOLDS_KEY  # re-exported: tests read the holds set
from cluster.wire import OpKind
from node.errors import ShardMovedOn
from node.store.redispy_pipe import Sender, load_scripts, own_sender, replies_or_raise
from node.store.replies import (
    SKEWED_REPLY,
    adjust_result,
    assemble,
    check_result,
    commit_result,
    fenced_epoch,
    is_expired,
    lease_result,
    refund_result,
    undo_entries,
)
from node.store.resp import RespPipe
from node.store.script_calls import (
    CHECK,
    LOG_UNITS_PER_CALL,
    NO_FENCE,
    Plan,
    ScriptCall,
    ScriptCalls,
    evalsha_commands,
    split_by_log_units,
)
from node.store.scripts import ScriptBook
from node.store.store_op import StoreOp

__all__ = [
    "DECISION_TTL_MS",
    "HOLDS_KEY",
    "CounterStore",
    "Plan",
    "adjust_result",
    "check_result",
    "commit_result",
    "fenced_epoch",
    "is_expired",
    "lease_result",
    "refund_result",
    "undo_entries",
]

# Ops run in the batch.lua call besides the checks.
BATCHED_KINDS = frozenset((OpKind.RENEW, OpKind.RELEASE))
# How long a decision record lasts once nothing needs it any more (node/store/lua/decide.lua).
DECISION_TTL_MS = 3_600_000
# The record key of an op naming a request_id, by its kind (a check's, refund's, ...: else).
_RECORD_KEY: dict[OpKind, Callable[[str, str, str], str]] = {OpKind.ADJUST: adjust_record_key}


def _ignore(_seconds: float) -> None:
    pass


class ReplicaAcks:
    """For a batch of `durability: replica` ops: every pipeline that carries its writes
    ends with WAIT `needed` on the same connection (WAIT counts the writes of its own
    connection); `missing` once any of them was not acknowledged by `needed` replicas
    in time, and `acked` the fewest that acknowledged one."""

    __slots__ = ("acked", "missing", "needed", "wait_ms")

    def __init__(self, wait_ms: int, needed: int = 1) -> None:
        self.wait_ms = max(1, wait_ms)  # WAIT 0 would wait forever
        self.needed = max(1, needed)
        self.missing = False
        self.acked = self.needed

    def commands(self, commands: list[Any]) -> list[Any]:
        return [*commands, ("WAIT", self.needed, self.wait_ms)]

    def note(self, replies: list[Any]) -> list[Any]:
        acked = replies.pop()
        count = acked if isinstance(acked, int) else 0
        self.acked = min(self.acked, count)
        if count < self.needed:
            self.missing = True
        return replies


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
        self._sender: Sender = own_sender(client, lean=raw_pipe)
        # The same connection where it is the lean pipe, which alone writes without a task
        # (send_now) and corks writes (node/edge/channel_server.py); else None.
        self.lean_pipe = self._sender if isinstance(self._sender, RespPipe) else None
        self.scripts = ScriptBook(client)
        self.calls = ScriptCalls(self.scripts, default_record_ttl_ms)
        self.decision_ttl_ms = DECISION_TTL_MS
        # Redis clock minus local clock, for computing calendar bounds close to Redis time.
        self.skew_ms = 0
        # Seconds of each script pipeline, for /metrics (node/health/metrics.py).
        self.on_redis_call: Callable[[float], None] = _ignore
        # The shard has replicas (its primary is found through Sentinel): `durable` ops
        # are acknowledged only once one holds them. Without, they are served as primary.
        self.replicated = False

    @property
    def offset_ms(self) -> int:
        """Test-mode clock offset, passed to every script; 0 in production."""
        return self.calls.offset_ms

    @offset_ms.setter
    def offset_ms(self, value: int) -> None:
        self.calls.offset_ms = value

    async def close(self) -> None:
        await self._sender.close()

    async def measure_skew(self) -> None:
        before = time.time()
        seconds, micros = await self.client.time()
        after = time.time()
        redis_ms = seconds * 1000 + micros // 1000
        self.skew_ms = redis_ms - int((before + after) * 500)

    def _estimated_now_ms(self) -> int:
        return int(time.time() * 1000) + self.skew_ms + self.calls.offset_ms

    @staticmethod
    def redis_keys(op: StoreOp) -> list[str]:
        """Every Redis key the operation may read or write."""
        keys = [counter_key(op.scope, spec.shape, op.key) for spec in op.limits]
        if op.request_id is not None:
            keys.append(_RECORD_KEY.get(op.kind, record_key)(op.scope, op.request_id, op.key))
        return keys

    async def refund_hold(self, keys: list[str], limit_args: list[int], epoch: int) -> Any:
        """Give back a hold that will not be committed (a hold entry, node/holds/keeper.py:
        its record then its counters, and LIMIT_ARGS ints per counter), placed by topology
        `epoch`. refund.lua acts only on a record still held, so this is safe to repeat.
        Its raw reply; raises ShardMovedOn (nothing done) when the shard is past `epoch`."""
        script, keys, args = self.calls.refund_call(
            keys, limit_args, void=True, only_held=True, epoch=epoch
        )
        return _unless_fenced(await script(keys=keys, args=args))

    async def commit_hold(self, record: str, epoch: int) -> Any:
        """Make a held decision final (commit.lua on its record key), placed by topology
        `epoch`; raises ShardMovedOn as refund_hold does."""
        script, keys, args = self.calls.commit_call(record, epoch)
        return _unless_fenced(await script(keys=keys, args=args))

    async def decide(self, batch: str, decision: str, holds: Sequence[str] = ()) -> str:
        """Record a batch's decision unless one exists; the decision that stands.
        A "commit" naming its `holds` does not expire before they all reported
        themselves settled (node/store/lua/decide.lua, settled.lua)."""
        keys = [DECISION_PREFIX + batch, PENDING_PREFIX + batch, DECISION_FENCE_KEY]
        args: list[str | int] = [decision, self.decision_ttl_ms]
        if decision == "commit":
            args += holds
        stored = await self.scripts.decide(keys=keys, args=args)
        return stored.decode() if isinstance(stored, bytes) else str(stored)

    async def settled(self, batch: str, holds: Sequence[str]) -> int:
        """Holds of a batch are settled; how many are still not (-1: this node handed
        its decision records over, node/holds/coordinator_records.py)."""
        keys = [DECISION_PREFIX + batch, PENDING_PREFIX + batch, DECISION_FENCE_KEY]
        left: int = await self.scripts.settled(keys=keys, args=[self.decision_ttl_ms, *holds])
        return left

    async def run(
        self,
        ops: Sequence[StoreOp],
        deadline_ms: int = 0,
        acks: ReplicaAcks | None = None,
        epoch: int = NO_FENCE,
    ) -> list[Any]:
        """Raw results in order, from ONE pipeline: one batch.lua call for all checks,
        renewals and releases, one call per refund or commit. A script error becomes an
        exception object in its op's slot. A check reaching Redis after `deadline_ms`
        (real Unix ms, 0 = none) is not applied: its raw result is EXPIRED_REPLY. With
        `acks`, each pipeline waits for a replica (ReplicaAcks). Ops placed by topology
        `epoch` are not applied once an endpoint of the shard adopted a newer one: their
        raw result is then FENCED's (replies.fenced_epoch)."""
        plan = self.plan(ops, deadline_ms, epoch)
        return await self.complete(plan, await self._evalsha_all(plan.calls, acks), acks)

    def plan(self, ops: Sequence[StoreOp], deadline_ms: int, epoch: int = NO_FENCE) -> Plan:
        """The script calls of run()."""
        now_ms = self._estimated_now_ms()
        batched: list[int] = []
        others: list[int] = []
        cost = 0  # of the batched ops: a bound on the sliding_log entries they may add
        for i, op in enumerate(ops):
            kind = op.kind
            if kind is CHECK or kind in BATCHED_KINDS:
                batched.append(i)
                cost += op.cost
            else:
                others.append(i)
        calls = self.calls
        planned = (
            [calls.by_kind[ops[i].kind](ops[i], now_ms, epoch) for i in others] if others else []
        )
        groups = [batched] if batched else []
        if cost > LOG_UNITS_PER_CALL:  # else no split is needed
            groups = split_by_log_units(ops, batched)
        if len(groups) == 1 and not others:
            planned = [calls.batch_call(ops, now_ms, deadline_ms, epoch)]
        elif groups:
            planned[:0] = [
                calls.batch_call([ops[i] for i in group], now_ms, deadline_ms, epoch)
                for group in groups
            ]
        return Plan(ops, deadline_ms, epoch, groups, others, planned)

    def send_now(self, plan: Plan, replied: Callable[[list[Any] | Exception], None]) -> bool:
        """The plan's pipeline written at once, without a task; `replied` gets the raw
        replies (or the connection error). False when that cannot be done now (no open
        lean connection: use run())."""
        if self.lean_pipe is None:
            return False
        started = time.perf_counter()

        def timed(outcome: list[Any] | Exception) -> None:
            self.on_redis_call(time.perf_counter() - started)
            replied(outcome)

        return self.lean_pipe.send_now(evalsha_commands(plan.calls), timed)

    @staticmethod
    def results_now(plan: Plan, replies: list[Any]) -> list[Any] | None:
        """run()'s results from the plan's replies, or None when some call must be sent
        again first (Redis lost its scripts, or a clock estimate was off), or when the
        shard refused a call (an endpoint adopted a newer topology): complete()."""
        if any(isinstance(r, NoScriptError) or fenced_epoch(r) for r in replies):
            return None
        results = assemble(plan, replies)
        return None if SKEWED_REPLY in results else results

    async def complete(
        self, plan: Plan, replies: list[Any], acks: ReplicaAcks | None = None
    ) -> list[Any]:
        """run()'s results from the plan's replies, sending again what did not run."""
        replies = await self._resend_missing(plan.calls, replies, acks)
        results = assemble(plan, replies)
        ops = plan.ops
        skewed = [i for i, r in enumerate(results) if r == SKEWED_REPLY]
        if skewed:
            # Our estimate of Redis time was more than a period off: re-measure, retry those.
            await self.measure_skew()
            retry = await self.run([ops[i] for i in skewed], plan.deadline_ms, acks, plan.epoch)
            for i, r in zip(skewed, retry, strict=True):
                results[i] = r
        return results

    async def undo(
        self, done: Sequence[tuple[StoreOp, Any]], *, recorded_only: bool = False
    ) -> int:
        """Take back checks that consumed (their raw results carry undo entries), in one
        pipeline: the answer to them is going out too late to count. How many. Whatever
        the shard's epoch now: what this node applied, it takes back where it applied it.
        A check with a request_id is given back only where its record is (undo.lua);
        `recorded_only` leaves the others as they are (after a failover, this primary may
        not hold them: counting one twice is the safe side, never losing one)."""
        now_ms = self._estimated_now_ms()
        calls: list[ScriptCall] = []
        for op, raw in done:
            if recorded_only and op.request_id is None:
                continue
            packed = undo_entries(op, raw)
            if packed is not None:
                calls.append(self.calls.undo_call(op, packed, now_ms, NO_FENCE))
        return await self._given_back(calls)

    async def take_back_recorded(self, ops: Sequence[StoreOp]) -> int:
        """Take back checks by their records alone (what each consumed is kept there), in
        one pipeline: a check sent again whose reply was lost may have run before. Checks
        without a request_id are skipped (they have no record). How many gave back."""
        now_ms = self._estimated_now_ms()
        calls = [
            self.calls.undo_call(op, b"", now_ms, NO_FENCE)
            for op in ops
            if op.kind is CHECK and op.request_id is not None
        ]
        return await self._given_back(calls)

    async def _given_back(self, calls: list[ScriptCall]) -> int:
        """undo.lua calls in one pipeline: how many gave something back."""
        if not calls:
            return 0
        results = replies_or_raise(await self._evalsha_all(calls))
        return sum(1 for r in results if isinstance(r, int) and r > 0)

    async def _execute(self, calls: list[ScriptCall], acks: ReplicaAcks | None) -> list[Any]:
        commands = evalsha_commands(calls)
        if acks is None:
            return await self._sender.execute(commands)
        return acks.note(await self._sender.execute(acks.commands(list(commands))))

    async def _evalsha_all(
        self, calls: list[ScriptCall], acks: ReplicaAcks | None = None
    ) -> list[Any]:
        """One pipeline of EVALSHA calls; results (or error objects) in order."""
        started = time.perf_counter()
        results = await self._execute(calls, acks)
        self.on_redis_call(time.perf_counter() - started)
        return await self._resend_missing(calls, results, acks)

    async def _resend_missing(
        self, calls: list[ScriptCall], replies: list[Any], acks: ReplicaAcks | None = None
    ) -> list[Any]:
        """Calls answered NOSCRIPT did not run: load their scripts, send them again."""
        missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if not missing:
            return replies
        await load_scripts(self._sender, {calls[i][0].sha: calls[i][0] for i in missing}.values())
        retried = await self._execute([calls[i] for i in missing], acks)
        replies = list(replies)
        for i, r in zip(missing, retried, strict=True):
            replies[i] = r
        return replies


def _unless_fenced(reply: Any) -> Any:
    epoch = fenced_epoch(reply)
    if epoch:
        raise ShardMovedOn(epoch)
    return reply
