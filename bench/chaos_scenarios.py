"""Fault scenarios under load, shared by tests/system/test_chaos.py and bench/chaos.py.

Everything is a real process, started by the cluster launcher (cluster.local.cluster):
redis-server with AOF, `shardlimit serve node`, `shardlimit serve router`. Faults are
real signals (SIGKILL, SIGSTOP/SIGCONT) sent through it. The scenario functions record
what every client saw (send/receive instants, status, degraded or not, why) and what
the router reported (/metrics, /readyz, /v1/cluster); tests assert on that record,
the bench times it.

The rules use long periods (a 3660-day fixed window, a calendar year) on the real
clock instead of the pinned test clock: a node process restarted mid-scenario
would run unpinned until re-pinned, racing the router's 100 ms probe.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
import orjson
import redis.asyncio as aioredis
import yaml

from cluster.local.cluster import LocalCluster, scratch_options
from cluster.local.procs import ChildProcess, until
from cluster.local.redis_proc import RedisProcess
from cluster.model.keys import limit_key_of
from cluster.model.partition import Partitioner, new_partitioner
from node.store.counter_store import HOLDS_KEY

ADMIN_TOKEN = "chaos-admin-token"
CLUSTER_TOKEN = "chaos-cluster-token"
WINDOW = "chaos-window"  # fixed_window: on_failure allow (fail open)
QUOTA = "chaos-quota"  # calendar: on_failure deny (fail closed)
MONEY = "chaos-money"  # calendar with amounts, for durability
LIMIT = 1_000_000
MAX_AMOUNT_MINOR = 100_000_000_00
RULES: dict[str, Any] = {
    "rules": {
        WINDOW: {"limits": [{"algorithm": "fixed_window", "limit": LIMIT, "window": "3660d"}]},
        QUOTA: {
            "limits": [
                {"algorithm": "calendar", "period": "year", "timezone": "UTC", "max_count": LIMIT}
            ]
        },
        MONEY: {
            "limits": [
                {
                    "algorithm": "calendar",
                    "period": "year",
                    "timezone": "UTC",
                    "max_count": LIMIT,
                    "max_amount": "100000000.00",
                }
            ]
        },
    }
}
Fault = Literal["redis_kill", "node_kill", "node_stop"]
FAULTS: tuple[Fault, ...] = ("redis_kill", "node_kill", "node_stop")


def now() -> float:
    return time.perf_counter()


def _parse_metrics(text: str) -> dict[str, dict[str, float]]:
    """`name{node="n1"} 3` lines -> {name: {node: value}}."""
    out: dict[str, dict[str, float]] = {}
    for match in re.finditer(r'^(\w+)\{node="([^"]+)"\} (\S+)$', text, re.MULTILINE):
        out.setdefault(match.group(1), {})[match.group(2)] = float(match.group(3))
    return out


def _write_rules(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "rules.yaml"
    path.write_text(yaml.safe_dump(RULES))
    return path


@dataclass
class ChaosCluster:
    """N Redis (AOF), N nodes and one router (cluster.local.cluster), and an HTTP session to
    read what the router says."""

    local: LocalCluster
    partitioner: Partitioner
    http: aiohttp.ClientSession

    @classmethod
    async def start(
        cls,
        root: Path,
        *,
        nodes: int = 3,
        appendfsync: str = "always",
        node_deadline: str = "1s",
        aon_hold: str = "10s",
        endpoints: int = 1,
    ) -> ChaosCluster:
        settings = {
            "rules_file": str(_write_rules(root)),
            "node_deadline": node_deadline,
            "aon_hold": aon_hold,
        }
        options = scratch_options(
            nodes,
            data_dir=root,
            appendfsync=appendfsync,
            log_level="WARNING",
            router_settings=settings,
            endpoints=endpoints,
        )
        local = LocalCluster(options, ADMIN_TOKEN, CLUSTER_TOKEN)
        local.start()  # blocks this loop for a moment: no load runs yet
        http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=30)
        )
        return cls(local, new_partitioner("ring", local.node_specs()), http)

    @property
    def router_url(self) -> str:
        return self.local.router_url

    @property
    def router(self) -> ChildProcess:
        return self.local.routers[0]

    @property
    def nodes(self) -> list[ChildProcess]:
        return self.local.nodes

    @property
    def redis(self) -> list[RedisProcess]:
        return self.local.redis

    @property
    def node_ports(self) -> list[int]:
        return [self.local.options.base_port + i for i in range(len(self.nodes))]

    def node_id(self, index: int) -> str:
        return self.local.node_id(index)

    def owner(self, key: str) -> str:
        return self.partitioner.owner(key)

    async def start_node(self, index: int) -> None:
        """Start a killed node again (same port, same Redis), without blocking the load."""
        await self.nodes[index].start_async()

    async def start_router(self) -> None:
        await self.router.start_async()

    async def close(self) -> None:
        """Router, nodes, then Redis; every child, even if one of them misbehaves."""
        try:
            self.local.stop()
        finally:
            await self.http.close()

    async def get(self, path: str, params: dict[str, str] | None = None) -> tuple[int, Any]:
        async with self.http.get(self.router_url + path, params=params) as resp:
            return resp.status, await resp.json(content_type=None)

    async def metrics(self) -> dict[str, dict[str, float]]:
        async with self.http.get(self.router_url + "/metrics") as resp:
            assert resp.status == 200
            return _parse_metrics(await resp.text())

    async def usage(self, key: str, rule: str) -> tuple[int, int]:
        """(count used, amount used in minor units) of a key under a rule, read exactly.

        Polls until the owner answers: right after a restart a read may be degraded
        (scenarios assert on that separately, from the clients' answers)."""
        answer: dict[str, Any] = {}

        async def read() -> bool:
            status, body = await self.get("/v1/usage", {"key": key, "rule": rule})
            answer.update(body)
            return status == 200 and body["degraded"] is False

        await until(read, 20, f"usage of {key} readable")
        view = answer["limits"][0]
        count = LIMIT - int(view["remaining"])
        amount = 0
        if view.get("amount_remaining") is not None:
            amount = MAX_AMOUNT_MINOR - int(str(view["amount_remaining"]).replace(".", ""))
        return count, amount

    def keys_by_node(self, per_node: int, prefix: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {self.node_id(i): [] for i in range(len(self.nodes))}
        for i in itertools.count():
            if all(len(v) >= per_node for v in out.values()):
                return out
            key = f"{prefix}:{i}"
            owner = self.owner(key)
            if len(out[owner]) < per_node:
                out[owner].append(key)
        raise AssertionError("unreachable")


# -- load: concurrent clients issuing /v1/check ------------------------------------


@dataclass
class Answer:
    key: str
    rule: str
    node: str
    sent: float
    received: float
    status: int
    allowed: bool
    degraded: bool
    reason: str | None

    @property
    def latency(self) -> float:
        return self.received - self.sent


class CheckLoad:
    """`concurrency` clients, each checking a random key under a random rule, back to back."""

    def __init__(
        self, router_url: str, keys: list[str], rules: tuple[str, ...], concurrency: int
    ) -> None:
        self.url = router_url + "/v1/check"
        self.keys = keys
        self.rules = rules
        self.concurrency = concurrency
        self.answers: list[Answer] = []
        self.problems: list[str] = []  # exceptions, 5xx, inconsistent bodies
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=30)
        )
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._worker(i)) for i in range(self.concurrency)]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.close()

    async def _worker(self, seed: int) -> None:
        assert self._http is not None
        rng = random.Random(seed)
        while not self._stop.is_set():
            key, rule = rng.choice(self.keys), rng.choice(self.rules)
            sent = now()
            try:
                async with self._http.post(self.url, json={"key": key, "rule": rule}) as resp:
                    status, raw = resp.status, await resp.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.problems.append(f"{key}: {type(exc).__name__} {exc}")
                continue
            received = now()
            try:
                body = orjson.loads(raw)
                answer = Answer(
                    key,
                    rule,
                    body["node"],
                    sent,
                    received,
                    status,
                    body["allowed"],
                    body["degraded"],
                    body.get("degraded_reason"),
                )
            except (orjson.JSONDecodeError, KeyError, TypeError):
                self.problems.append(f"{key}: HTTP {status} {raw[:200]!r}")
                continue
            if status != (200 if answer.allowed else 429):
                self.problems.append(f"{key}: HTTP {status} for allowed={answer.allowed}")
            self.answers.append(answer)

    def count(self, *, node: str, sent_after: float) -> int:
        return sum(1 for a in self.answers if a.node == node and a.sent >= sent_after)


# -- scenario 1-3: a node's Redis or the node itself fails under load ---------------


@dataclass
class FaultSizes:
    """How long each phase runs: answers counted, plus a floor in seconds (bench only)."""

    warm_answers: int = 300
    fault_answers: int = 300  # victim answers after the breaker opened
    post_answers: int = 200  # victim answers after recovery
    min_fault_s: float = 0.0
    min_post_s: float = 0.0


@dataclass
class FaultRun:
    fault: Fault
    victim: str
    answers: list[Answer]
    problems: list[str]
    fault_at: float  # the victim is dead / stopped from here
    open_seen_at: float  # /metrics first showed its breaker open
    heal_started_at: float  # restart begun (Redis / node process spawned, SIGCONT about to go)
    heal_at: float  # the victim is back (Redis PONGs, node /healthz answers, SIGCONT sent)
    recovered_at: float  # first normal answer for a victim key sent after heal_at
    post_from: float  # answers sent after this are the "resumed" phase
    requests_at_open: int  # router -> victim batch requests when the breaker was seen open
    requests_at_heal: int  # ... and just before the fault ended
    failures_at_open: int
    readyz: tuple[int, Any]  # while down
    cluster_state: str  # the victim's state in /v1/cluster while down
    readyz_after: tuple[int, Any] = (0, None)
    owners: dict[str, str] = field(default_factory=dict)  # key -> node, per the topology
    usage: dict[tuple[str, str], int] = field(default_factory=dict)

    def victim_answers(self, start: float, end: float) -> list[Answer]:
        return [a for a in self.answers if a.node == self.victim and start <= a.sent < end]

    def other_answers(self, start: float, end: float) -> list[Answer]:
        return [a for a in self.answers if a.node != self.victim and start <= a.sent < end]


def _inject(cluster: ChaosCluster, fault: Fault, index: int) -> None:
    if fault == "redis_kill":
        cluster.redis[index].kill()
    elif fault == "node_kill":
        cluster.nodes[index].kill()
    else:
        cluster.nodes[index].pause()


async def _heal(cluster: ChaosCluster, fault: Fault, index: int) -> None:
    if fault == "redis_kill":
        await cluster.redis[index].start_async()  # same port, same dir: the AOF is replayed
    elif fault == "node_kill":
        await cluster.start_node(index)
    else:
        cluster.nodes[index].resume()


async def run_fault(
    cluster: ChaosCluster,
    fault: Fault,
    *,
    victim_index: int = 0,
    per_node_keys: int = 12,
    concurrency: int = 24,
    sizes: FaultSizes | None = None,
    read_usage: bool = True,
) -> FaultRun:
    """Load on every node; break the victim; watch the breaker; heal; watch traffic return."""
    sizes = sizes or FaultSizes()
    victim = cluster.node_id(victim_index)
    by_node = cluster.keys_by_node(per_node_keys, f"{fault}")
    keys = [k for node_keys in by_node.values() for k in node_keys]
    load = CheckLoad(cluster.router_url, keys, (WINDOW, QUOTA), concurrency)

    def victim_count(after: float) -> Callable[[], bool]:
        return lambda: load.count(node=victim, sent_after=after) >= sizes.fault_answers

    await load.start()
    try:
        await until(lambda: len(load.answers) >= sizes.warm_answers, 60, "warm-up answers")
        _inject(cluster, fault, victim_index)
        fault_at = now()

        async def breaker_open() -> bool:
            return (await cluster.metrics())["shardlimit_node_up"][victim] == 0

        await until(breaker_open, 30, f"breaker of {victim} open")
        open_seen_at = now()
        metrics = await cluster.metrics()
        requests_at_open = int(metrics["shardlimit_node_requests_total"][victim])
        failures_at_open = int(metrics["shardlimit_node_failures_total"][victim])
        readyz = await cluster.get("/readyz")
        _, info = await cluster.get("/v1/cluster")
        cluster_state = {n["id"]: n["state"] for n in info["nodes"]}[victim]
        await until(victim_count(open_seen_at), 60, "victim answers while down")
        await until(lambda: now() - fault_at >= sizes.min_fault_s, 600, "fault duration")
        metrics = await cluster.metrics()
        requests_at_heal = int(metrics["shardlimit_node_requests_total"][victim])
        heal_started_at = now()
        await _heal(cluster, fault, victim_index)
        heal_at = now()

        def recovered() -> bool:
            return any(
                a.node == victim and a.sent >= heal_at and not a.degraded for a in load.answers
            )

        await until(recovered, 30, f"normal answers for {victim}'s keys")
        recovered_at = min(
            a.received
            for a in load.answers
            if a.node == victim and a.sent >= heal_at and not a.degraded
        )
        post_from = now()
        await until(
            lambda: load.count(node=victim, sent_after=post_from) >= sizes.post_answers,
            60,
            "victim answers after recovery",
        )
        await until(lambda: now() - post_from >= sizes.min_post_s, 600, "post duration")
    finally:
        await load.stop()
    readyz_after = await cluster.get("/readyz")
    run = FaultRun(
        fault,
        victim,
        list(load.answers),
        list(load.problems),
        fault_at,
        open_seen_at,
        heal_started_at,
        heal_at,
        recovered_at,
        post_from,
        requests_at_open,
        requests_at_heal,
        failures_at_open,
        readyz,
        cluster_state,
        readyz_after,
    )
    run.owners = {k: node for node, node_keys in by_node.items() for k in node_keys}
    for key in keys if read_usage else ():
        for rule in (WINDOW, QUOTA):
            run.usage[(key, rule)] = (await cluster.usage(key, rule))[0]
    return run


# -- scenario 4: Redis SIGKILLed while acknowledged writes stream in ----------------


@dataclass
class DurabilityRun:
    appendfsync: str
    killed_at: float
    acks: dict[str, list[float]]  # per key: when each (sequential) write was acknowledged
    survived: dict[str, tuple[int, int]]  # per key: (count, amount in minor units) after restart
    amount_minor: int  # per write
    problems: list[str]

    def lost(self, key: str) -> int:
        return max(0, len(self.acks[key]) - self.survived[key][0])

    def loss_window_s(self) -> float:
        """How long before the kill the oldest lost acknowledged write was acknowledged."""
        windows = [
            self.killed_at - self.acks[k][self.survived[k][0]] for k in self.acks if self.lost(k)
        ]
        return max(windows, default=0.0)


async def run_durability(
    cluster: ChaosCluster, *, writers: int = 24, run_s: float = 3.5, amount: str = "1.25"
) -> DurabilityRun:
    """One sequential writer per key (so what survives is a prefix); SIGKILL every Redis
    while they write; restart them; read back what survived."""
    keys = [k for ks in cluster.keys_by_node(writers // 3 + 1, "dur").values() for k in ks]
    acks: dict[str, list[float]] = {k: [] for k in keys}
    problems: list[str] = []
    stop = asyncio.Event()

    async def writer(key: str) -> None:
        body = {"key": key, "rule": MONEY, "amount": amount}
        while not stop.is_set():
            try:
                async with cluster.http.post(cluster.router_url + "/v1/check", json=body) as resp:
                    data = await resp.json()
            except (aiohttp.ClientError, TimeoutError) as exc:
                problems.append(f"{key}: {exc!r}")
                continue
            if data["degraded"]:
                return  # Redis is gone: this write may or may not have been applied
            if resp.status != 200:
                problems.append(f"{key}: {resp.status} {data}")
                return
            acks[key].append(now())

    started = now()
    tasks = [asyncio.get_running_loop().create_task(writer(k)) for k in keys]
    try:
        # Time passing is the condition: writes must exist older than the loss bound.
        await until(lambda: now() - started >= run_s, run_s + 60, "writers ran")
        killed_at = now()
        for server in cluster.redis:
            server.kill()
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.gather(*[r.start_async() for r in cluster.redis])

    survived = {k: await cluster.usage(k, MONEY) for k in keys}
    minor = int(amount.replace(".", ""))
    return DurabilityRun(cluster.redis[0].appendfsync, killed_at, acks, survived, minor, problems)


# -- scenario 5: a router SIGKILLed in the middle of all_or_nothing batches ---------


@dataclass
class AonRun:
    batches: dict[int, list[str]]  # every batch a client started to send
    answered: dict[int, bool]  # batch -> "allowed" for those answered before the kill
    held_at_kill: set[int]  # batches with an uncommitted hold on some node at the kill
    held_keys: set[str]  # the keys of those holds
    holds_at_kill: int  # hold entries over all nodes at the kill
    usage: dict[str, int]
    owners: dict[str, str]
    given_back_s: float  # kill -> no hold left on any node
    problems: list[str]

    def outcome(self, batch: int) -> str:
        used = {self.usage[k] for k in self.batches[batch]}
        if used == {1}:
            return "committed"
        if used == {0}:
            return "nothing"
        return "partial"

    def in_flight(self) -> list[int]:
        """Batches sent but not answered when the router died."""
        return [b for b in self.batches if b not in self.answered]

    def caught_mid_flight(self) -> list[int]:
        """In-flight batches that had an uncommitted hold on some node at the kill."""
        return [b for b in self.in_flight() if b in self.held_at_kill]

    def explain(self, batch: int) -> list[tuple[str, str, int, bool]]:
        """(key, owner, usage, held at the kill) for each check of a batch."""
        return [
            (k, self.owners[k], self.usage[k], k in self.held_keys) for k in self.batches[batch]
        ]


async def _holds(cluster: ChaosCluster) -> list[str]:
    """The limit keys of every uncommitted hold, over all nodes."""
    keys: list[str] = []
    for server in cluster.redis:
        client = aioredis.Redis(port=server.port, socket_timeout=2.0)
        try:
            entries = await client.zrange(HOLDS_KEY, 0, -1)
        finally:
            await client.aclose()
        for raw in entries:
            assert isinstance(raw, bytes | str)
            record_key = orjson.loads(raw)["k"][0]
            limit_key = limit_key_of(record_key if isinstance(record_key, str) else "")
            if limit_key is not None:
                keys.append(limit_key)
    return keys


async def run_router_kill(
    cluster: ChaosCluster,
    *,
    clients: int = 32,
    per_node: int = 2,
    answered_before_kill: int = 150,
    victim: ChildProcess | None = None,
    rule: str = WINDOW,
) -> AonRun:
    """Clients flood the router with all_or_nothing batches (distinct keys, spanning every
    node); SIGKILL it mid-flow; let the nodes give uncommitted holds back; restart it.
    With `victim` (a node process: a coordinator's endpoint), that one is SIGKILLed
    instead, and the router keeps running. `rule`: the batches' rule (a fail-open one
    admits a check its node could not decide, unconsumed: not a half-applied batch)."""
    nodes = [cluster.node_id(i) for i in range(len(cluster.nodes))]
    batches: dict[int, list[str]] = {}
    answered: dict[int, bool] = {}
    problems: list[str] = []
    counter = itertools.count()
    key_ids = itertools.count()
    killed = asyncio.Event()

    def batch_keys(batch: int) -> list[str]:
        wanted = Counter({n: per_node for n in nodes})
        keys: list[str] = []
        while wanted:
            key = f"aon:{batch}:{next(key_ids)}"
            owner = cluster.owner(key)
            if wanted[owner] > 0:
                keys.append(key)
                wanted[owner] -= 1
                if wanted[owner] == 0:
                    del wanted[owner]
        return keys

    async def client() -> None:
        while not killed.is_set():
            batch = next(counter)
            batches[batch] = batch_keys(batch)
            body = {
                "all_or_nothing": True,
                "checks": [{"key": k, "rule": rule} for k in batches[batch]],
            }
            try:
                async with cluster.http.post(
                    cluster.router_url + "/v1/check/batch", json=body
                ) as resp:
                    data = await resp.json(content_type=None)
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError):
                if not killed.is_set():
                    problems.append(f"batch {batch}: router unreachable before the kill")
                return
            if status != 200:
                problems.append(f"batch {batch}: HTTP {status} {data}")
                return
            answered[batch] = bool(data["allowed"])

    tasks = [asyncio.get_running_loop().create_task(client()) for _ in range(clients)]
    try:
        await until(lambda: len(answered) >= answered_before_kill, 120, "batches answered")
        killed.set()  # from here on, an unreachable router is the expected outcome
        (victim or cluster.router).kill()
        killed_at = now()
        held = await _holds(cluster)
    finally:
        killed.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    answered_at_kill = dict(answered)
    held_batches = {int(k.split(":")[1]) for k in held if k.startswith("aon:")}

    async def no_holds() -> bool:
        return not await _holds(cluster)

    await until(no_holds, 60, "every hold given back")
    given_back_s = now() - killed_at
    if victim is None:
        await cluster.start_router()
    keys = [k for ks in batches.values() for k in ks]
    usage = {k: (await cluster.usage(k, rule))[0] for k in keys}
    owners = {k: cluster.owner(k) for k in keys}
    return AonRun(
        batches,
        answered_at_kill,
        held_batches,
        set(held),
        len(held),
        usage,
        owners,
        given_back_s,
        problems,
    )


# -- figures ---------------------------------------------------------------------


def percentiles_ms(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)

    return {
        "n": len(ordered),
        "p50_ms": at(0.5),
        "p99_ms": at(0.99),
        "max_ms": round(ordered[-1] * 1000, 2),
    }
