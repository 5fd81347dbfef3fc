"""Live resharding under concurrent load: nothing lost, nothing doubled, only owners change."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import msgspec
import pytest
import redis as sync_redis
import redis.asyncio as aioredis
import yaml

from cluster import wire
from cluster.local.loadgen import LoadProcess, start_loadgen
from cluster.local.redis_proc import RedisProcess, free_port
from cluster.model.keys import DATA_KEYS_PATTERN, counter_key, limit_key_of, record_key
from cluster.model.nodes import NodeSpec
from cluster.model.partition import new_partitioner
from cluster.model.topology import Topology
from node.app import STATE
from node.migration import copy_step as copy_step_module
from node.migration import migrator as migrator_module
from node.migration.copy_step import Finder
from node.migration.direct import LANDED_GROUP
from node.migration.entries import decode_entries
from node.store.redispy_pipe import own_sender
from node.topology.ownership import Ownership
from tests.conftest import (
    ADMIN,
    CLUSTER,
    Cluster,
    add_spare_node,
    batch_at,
    eventually,
    node_batch,
    start_cluster,
    stop_cluster,
)

FIXED = {"algorithm": "fixed_window", "limit": 1000, "window": "1h"}
MONEY = {
    "algorithm": "calendar",
    "period": "day",
    "timezone": "Europe/Paris",
    "max_amount": "100000.00",
}
NODE_AUTH = {"Authorization": f"Bearer {CLUSTER}"}
KEYS = [f"user:{i}" for i in range(3000)] + [f"{{team:{i % 300}}}:m{i}" for i in range(2000)]


def limits_for(key: str) -> list[dict[str, Any]]:
    return [MONEY] if key.startswith("{") else [FIXED]


@pytest.fixture(params=["ring", "slots"])
async def big_cluster(
    request: pytest.FixtureRequest,
    redis_servers: list[RedisProcess],
    fourth_redis: RedisProcess,
    tmp_path: Path,
) -> AsyncIterator[tuple[Cluster, str]]:
    cluster = await start_cluster(redis_servers, tmp_path, partitioner=request.param)
    n4_url = await add_spare_node(cluster, fourth_redis)
    try:
        yield cluster, n4_url
    finally:
        await stop_cluster(cluster)


async def preload(cluster: Cluster) -> dict[str, int]:
    rng = random.Random(7)
    used: dict[str, int] = {}
    checks = []
    for key in KEYS:
        cost = rng.randint(1, 3)
        used[key] = cost
        body: dict[str, Any] = {"key": key, "limits": limits_for(key), "cost": cost}
        if key.startswith("{"):
            body["amount"] = f"{cost}.25"
        checks.append(body)
    for start in range(0, len(checks), 500):
        status, body = await cluster.post(
            "/v1/check/batch", {"checks": checks[start : start + 500]}
        )
        assert status == 200 and all(r["allowed"] for r in body["results"])
    return used


async def wait_migration_done(cluster: Cluster) -> dict[str, Any]:
    final: dict[str, Any] = {}

    async def done() -> bool:
        _, info = await cluster.get("/v1/cluster")
        migration = info["migration"]
        if migration and migration.get("last_error"):
            raise AssertionError(migration["last_error"])
        if migration and migration.get("phase") == "done" and not migration["running"]:
            final.update(migration)
            final["epoch"] = info["epoch"]
            return True
        return False

    await eventually(done, within=90)
    return final


class Load:
    """Checks of random keys from a load generator in its own process (64 connections);
    counts what was admitted per key once stopped."""

    CONNECTIONS = 64

    def __init__(self, cluster: Cluster, workdir: Path) -> None:
        self.cluster = cluster
        self.bodies = workdir / "bodies.jsonl"
        rng = random.Random(11)
        lines = []
        for key in rng.sample(KEYS, len(KEYS)):
            body: dict[str, Any] = {"key": key, "limits": limits_for(key)}
            if key.startswith("{"):
                body["amount"] = "0.50"
            lines.append(json.dumps(body))
        self.bodies.write_text("\n".join(lines) + "\n")
        self.admitted: Counter[str] = Counter()
        self.amounts: Counter[str] = Counter()  # minor units
        self.report: dict[str, Any] = {}
        self._process: LoadProcess | None = None

    async def start(self) -> None:
        self._process = await start_loadgen(
            self.cluster.router_url + "/v1/check",
            connections=self.CONNECTIONS,
            body="",
            bodies_file=str(self.bodies),
            per_key=True,
        )

    async def stop(self) -> None:
        assert self._process is not None
        self.report = await self._process.stop()
        self.admitted.update(self.report["allowed_by_key"])
        for key, count in self.admitted.items():
            if key.startswith("{"):
                self.amounts[key] = 50 * count


async def assert_totals(cluster: Cluster, used: dict[str, int], load: Load) -> None:
    """Every key: what its node holds now == preloaded + admitted during the run."""
    for start in range(0, len(KEYS), 500):
        chunk = KEYS[start : start + 500]
        checks = [{"key": k, "limits": limits_for(k), "cost": 0} for k in chunk]
        _, body = await cluster.post("/v1/check/batch", {"checks": checks})
        for key, result in zip(chunk, body["results"], strict=True):
            limit = result["limits"][0]
            if key.startswith("{"):
                left = 10_000_000 - (used[key] * 100 + 25 + load.amounts[key])
                assert limit["amount_remaining"] == f"{left // 100}.{left % 100:02d}", key
            else:
                assert limit["remaining"] == 1000 - used[key] - load.admitted[key], key


def owners(cluster: Cluster) -> dict[str, str]:
    return {key: cluster.router.view.owner(key) for key in KEYS}


def redis_key_counts(cluster: Cluster) -> dict[str, int]:
    counts = {}
    for index, server in enumerate(cluster.redis):
        client = sync_redis.Redis(port=server.port)
        counts[f"n{index + 1}"] = sum(
            1 for k in client.scan_iter(match="c*", count=1000) if limit_key_of(k.decode())
        )
        client.close()
    return counts


@pytest.mark.timeout(180)
async def test_add_then_remove_under_load(big_cluster: tuple[Cluster, str], tmp_path: Path) -> None:
    cluster, n4_url = big_cluster
    used = await preload(cluster)
    load = Load(cluster, tmp_path)
    before = owners(cluster)
    await load.start()
    served = cluster.router.metrics.served

    async def flowing() -> bool:
        return served("/v1/check") >= 500

    await eventually(flowing)  # the load is on before the move starts
    admin = ADMIN
    status, started = await cluster.post("/v1/cluster/nodes", {"url": n4_url, "id": "n4"}, admin)
    assert status == 202, started
    first = await wait_migration_done(cluster)
    after_add = owners(cluster)
    changed = [k for k in KEYS if before[k] != after_add[k]]
    assert all(after_add[k] == "n4" for k in changed)  # only keys the new node takes move
    assert first["keys_moved"] == len(changed)
    share = Counter(after_add.values())["n4"] / len(KEYS)
    assert 0.6 * 0.25 <= share <= 1.4 * 0.25

    async with cluster.http.delete(
        cluster.router_url + "/v1/cluster/nodes/n2", headers={"Authorization": f"Bearer {admin}"}
    ) as resp:
        assert resp.status == 202, await resp.text()
    second = await wait_migration_done(cluster)
    after_remove = owners(cluster)
    changed = [k for k in KEYS if after_add[k] != after_remove[k]]
    assert all(after_add[k] == "n2" for k in changed)  # only n2's keys move
    assert second["keys_moved"] == len(changed) == Counter(after_add.values())["n2"]

    during = served("/v1/check")
    await load.stop()
    report = load.report
    print(f"{report['answered']} checks, {during} of them before the second move ended")
    assert report["errors"] == 0, report["error_samples"]
    assert report["degraded"] == 0, report["degraded_reasons"]
    assert report["allowed"] == sum(load.admitted.values()) > 0
    await assert_totals(cluster, used, load)
    counts = redis_key_counts(cluster)
    assert counts["n2"] == 0  # the removed node was drained
    for server in cluster.redis:
        direct = sync_redis.Redis(port=server.port)
        assert list(direct.scan_iter(match="sl|i*")) == []  # import markers and their index dropped
        direct.close()
    assert sum(counts.values()) == len(KEYS)  # each counter lives on exactly one node
    status, info = await cluster.get("/v1/cluster")
    assert [n["id"] for n in info["nodes"]] == ["n1", "n3", "n4"]


def start_router_process(config_path: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, SHARDLIMIT_ADMIN_TOKEN=ADMIN, SHARDLIMIT_CLUSTER_TOKEN=CLUSTER)
    return subprocess.Popen(
        [sys.executable, "-m", "cluster.cli", "serve", "router", "--config", str(config_path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.timeout(180)
async def test_sigkilled_orchestrator_resumes_and_a_second_router_follows(
    redis_servers: list[RedisProcess], fourth_redis: RedisProcess, tmp_path: Path
) -> None:
    # Router B (in this process) carries the load; router A (a real process) runs the
    # migration and is SIGKILLed in the middle of it, then restarted to resume.
    cluster = await start_cluster(redis_servers, tmp_path, partitioner="slots")
    n4_url = await add_spare_node(cluster, fourth_redis)
    a_port = free_port()
    a_url = f"http://127.0.0.1:{a_port}"
    nodes = [{"id": n, "url": u} for n, u in cluster.node_urls.items()]
    config = {
        "router": {
            "port": a_port,
            "data_dir": str(tmp_path / "router-a"),
            "reshard_step_keys": 50,
            "reshard_lease_ttl": "1s",
        },
        "cluster": {"partitioner": "slots", "nodes": nodes},
    }
    config_path = tmp_path / "a.yaml"
    config_path.write_text(yaml.safe_dump(config))
    router_a = start_router_process(config_path)
    try:
        used = await preload(cluster)
        load = Load(cluster, tmp_path)

        async def a_get(path: str) -> Any:
            async with cluster.http.get(a_url + path) as resp:
                return await resp.json()

        async def a_up() -> bool:
            try:
                return bool((await a_get("/healthz"))["status"] == "ok")
            except aiohttp.ClientError:
                return False

        await eventually(a_up, within=30)
        before = owners(cluster)
        await load.start()
        headers = {"Authorization": f"Bearer {ADMIN}"}
        body = {"url": n4_url, "id": "n4"}
        async with cluster.http.post(
            a_url + "/v1/cluster/nodes", json=body, headers=headers
        ) as resp:
            assert resp.status == 202, await resp.text()
            migrating_epoch = (await resp.json())["epoch"]

        async def midway() -> bool:
            migration = (await a_get("/v1/cluster"))["migration"] or {}
            return int(migration.get("keys_moved", 0)) >= 200

        await eventually(midway, within=60)
        router_a.send_signal(signal.SIGKILL)
        router_a.wait(10)
        # Router B learns the migrating epoch from the nodes by itself.
        seen = time.monotonic()

        async def b_follows() -> bool:
            return bool(cluster.router.view.topology.epoch >= migrating_epoch)

        await eventually(b_follows, within=10)
        follow_s = time.monotonic() - seen
        counts_mid = redis_key_counts(cluster)
        assert 0 < counts_mid["n4"] < sum(counts_mid.values())  # really stopped midway

        router_a = start_router_process(config_path)
        await eventually(a_up, within=30)
        async with cluster.http.post(
            a_url + "/v1/cluster/migration/resume", headers=headers
        ) as resp:
            assert resp.status == 202, await resp.text()

        async def finished() -> bool:
            info = await a_get("/v1/cluster")
            migration = info["migration"] or {}
            assert not migration.get("last_error"), migration
            return migration.get("phase") == "done" and not migration.get("running")

        await eventually(finished, within=90)

        async def b_final() -> bool:
            return cluster.router.view.topology.migration is None

        await eventually(b_final, within=10)
        await load.stop()
        assert load.report["errors"] == 0, load.report["error_samples"]
        assert load.report["degraded"] == 0, load.report["degraded_reasons"]
        after = owners(cluster)
        changed = [k for k in KEYS if before[k] != after[k]]
        assert changed and all(after[k] == "n4" for k in changed)
        counts = redis_key_counts(cluster)
        assert sum(counts.values()) == len(KEYS)
        assert counts["n4"] == Counter(after.values())["n4"]
        await assert_totals(cluster, used, load)
        print(f"router B followed the new epoch after {follow_s:.3f} s")
    finally:
        router_a.kill()
        router_a.wait(10)
        await stop_cluster(cluster)


async def test_reshard_cli_plan_and_status(cluster: Cluster) -> None:
    env = dict(os.environ, SHARDLIMIT_ROUTER=cluster.router_url, SHARDLIMIT_ADMIN_TOKEN=ADMIN)

    async def cli(*args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "cluster.cli",
            *args,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        return proc.returncode or 0, out.decode(), err.decode()

    code, out, err = await cli("reshard", "plan", "--add", "http://127.0.0.1:9", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["dry_run"] is True and {m["target"] for m in plan["moves"]} == {"n4"}
    # The plan says what applying it now would meet: nothing listens there.
    assert plan["refused"]["status"] == 422, plan
    assert plan["refused"]["type"].endswith("/node-unreachable"), plan
    code, out, err = await cli("reshard", "plan", "--add", "http://127.0.0.1:9")
    assert code == 0, err
    assert "applied now, this would be refused (422): node n4 at http://127.0.0.1:9" in out
    assert 0.15 < sum(m["fraction"] for m in plan["moves"]) < 0.35
    assert cluster.router.view.topology.epoch == 1  # a plan changes nothing
    code, out, err = await cli("reshard", "status", "--json")
    assert code == 0 and json.loads(out) is None
    code, out, err = await cli("reshard", "resume")
    assert code == 2 and "no migration to resume" in err
    code, out, err = await cli("node", "remove", "n9")
    assert code == 2 and "404" in err
    env["SHARDLIMIT_ADMIN_TOKEN"] = "wrong"
    code, out, err = await cli("node", "add", "http://127.0.0.1:9")
    assert code == 2 and "401" in err


@pytest.mark.parametrize(
    ("kind", "in_redis", "ahead"),
    [
        ("ring", False, False),
        ("ring", False, True),
        ("slots", False, False),
        ("slots", False, True),
        ("slots", True, False),
    ],
)
async def test_a_source_finds_exactly_the_keys_that_move(
    kind: str, in_redis: bool, ahead: bool, redis_servers: list[RedisProcess]
) -> None:
    """The copy's finder (Lua CRC16 slots in Redis, or the ring's moving arcs) keeps
    exactly the Redis keys whose limit key leaves this node, and names their target;
    `ahead`: each SCAN sent while the names of the one before are classified."""
    nodes = [NodeSpec(f"n{i}", f"http://127.0.0.1:{9000 + i}") for i in range(1, 5)]
    old = new_partitioner(kind, nodes[:3])
    topology = Topology(2, old.resized(nodes), {"id": "m1", "from": old.to_dict()})
    ownership = Ownership.build("n1", topology)
    rng = random.Random(3)
    limit_keys = [f"user:{i}" for i in range(3000)] + [
        "{tag}:a",
        "x{tag}y",
        "{}:empty-tag",
        "{:open",
        "caf\u00e9:\u00fc\u00f1\u00ee",
        "a|b|c",
        "q#3",
        "{team:7}:m1",
        "}{",
        "",
    ]
    client = sync_redis.Redis(port=redis_servers[0].port)
    names = []
    for key in limit_keys:
        names.append(counter_key("rule", f"shape{rng.randint(0, 3)}", key))
        if rng.random() < 0.3:
            names.append(record_key("rule", f"req-{rng.randint(0, 99)}", key))
    client.mset({name: "1" for name in names})
    client.set("sl|holds-not-data", "1")
    expected: dict[str, set[str]] = {}
    for name in names:
        target = ownership.moving_away(limit_key_of(name) or "")
        if target is not None:
            expected.setdefault(target, set()).add(name)
    assert expected  # some keys move, all to the new node
    aio = aioredis.Redis(port=redis_servers[0].port)
    sender = own_sender(aio)
    finder = Finder(aio, ownership, sender, in_redis=in_redis)
    assert (finder.slot_table is not None) == (kind == "slots")
    wanted = 10**9 if ahead else 0
    if ahead:  # a call that does not take the SCAN sent ahead gets its own cursor's names
        first = await finder.find(0, 500, wanted)
        assert await finder.find(0, 500, wanted) == first
    found: dict[str, set[str]] = {}
    cursor, examined = 0, 0
    while True:
        cursor, seen, step = await finder.find(cursor, 500, wanted)
        examined += seen
        for target, keys in step.items():
            found.setdefault(target, set()).update(keys)
        if cursor == 0:
            break
    assert found == expected and list(found) == ["n4"]
    assert examined >= len(names)
    # Removing n4 again: n1 only gains keys, so its finder scans nothing at all.
    back = Topology(3, old, {"id": "m2", "from": topology.partitioner.to_dict()})
    gaining = Ownership.build("n1", back)
    assert all(gaining.moving_away(limit_key_of(name) or "") is None for name in names)
    idle = Finder(aio, gaining, sender, in_redis=in_redis)
    assert idle.loses_nothing and not finder.loses_nothing
    assert await idle.find(0, 500) == (0, 0, {})
    await sender.close()
    await aio.aclose()
    client.close()


async def test_a_change_while_the_lock_node_is_down_is_unavailable_not_refused(
    cluster: Cluster, fourth_redis: RedisProcess
) -> None:
    """The topology lease lives on the first node by id: while its Redis is gone (failing
    over, say) a node add is a 503 to retry, not a 409 refusal, and nothing changes."""
    n4_url = await add_spare_node(cluster, fourth_redis)
    epoch = cluster.router.view.topology.epoch
    cluster.redis[0].stop()  # n1's; the next test's fixture starts it again
    status, problem = await cluster.post("/v1/cluster/nodes", {"url": n4_url, "id": "n4"}, ADMIN)
    assert status == 503, problem
    assert problem["type"].endswith("/lock-node-unavailable")
    assert "the lock node n1 did not answer" in problem["detail"]
    assert cluster.router.view.topology.epoch == epoch


async def test_a_copy_step_with_a_bad_budget_is_refused(cluster: Cluster) -> None:
    headers = {"Authorization": f"Bearer {CLUSTER}"}
    for budget in ({"rate": -1}, {"busy_pct": 0}, {"busy_pct": 101}, {"rate": "fast"}):
        body = {"migration": "m", "cursor": 0, "count": 100, **budget}
        async with cluster.http.post(
            cluster.node_urls["n1"] + "/node/v1/migrate", json=body, headers=headers
        ) as resp:
            assert resp.status == 400, (budget, await resp.text())


class ByHand(NamedTuple):
    """n4 started, and the topology adding it built but not pushed (no orchestrator)."""

    n4_url: str
    before: Topology
    adding: Topology
    op: wire.Op  # a check of a key moving from n1 to n4, counted once on n1


async def add_n4_by_hand(cluster: Cluster, fourth_redis: RedisProcess) -> ByHand:
    n4_url = await add_spare_node(cluster, fourth_redis)
    before = cluster.router.view.topology
    adding = dataclasses.replace(
        before,
        epoch=before.epoch + 1,
        partitioner=before.partitioner.resized([*before.nodes, NodeSpec("n4", n4_url)]),
        migration={"id": "madd", "from": before.partitioner.to_dict()},
    )
    key = next(
        k
        for k in (f"user:{i}" for i in range(1000))
        if before.partitioner.owner(k) == "n1" and adding.partitioner.owner(k) == "n4"
    )
    fixed = ["fixed_window", 10, 3_600_000, 0, "", "", None, 2]
    op = wire.Op("check", key, "~inline", [fixed], [0], cost=1)
    [first] = await node_batch(cluster, "n1", [op])
    assert isinstance(first, wire.Checked) and first.limits[0].remaining == 9
    return ByHand(n4_url, before, adding, op)


async def put_topology(cluster: Cluster, url: str, topology: Topology) -> None:
    async with cluster.http.put(
        url + wire.TOPOLOGY_PATH, json=topology.to_dict(), headers=NODE_AUTH
    ) as resp:
        assert resp.status == 200, await resp.text()


async def test_a_source_exports_a_key_only_once_its_older_batches_reached_redis(
    cluster: Cluster, fourth_redis: RedisProcess
) -> None:
    """A node that took a migrating topology may still have a batch of the older one on
    its way to Redis. A new owner pulling a moving key meanwhile must get it with that
    batch's count, else the count is lost. Here the batch is held back by pausing the
    source's Redis for writes (reads, like the export's DUMP, still go through)."""
    n4_url, before, adding, op = await add_n4_by_hand(cluster, fourth_redis)
    source = aioredis.Redis(port=cluster.redis[0].port)
    names = [
        name.decode()
        async for name in source.scan_iter(match="*")
        if limit_key_of(name.decode()) == op.key
    ]
    assert len(names) == 1
    state = cluster.runners[0].app[STATE]  # n1's
    await source.client_pause(1500, all=False)  # writes only
    second = asyncio.create_task(node_batch(cluster, "n1", [op]))

    async def in_flight() -> bool:
        return state.gate.in_flight(before.epoch) == 1

    await eventually(in_flight)
    adopt = asyncio.create_task(put_topology(cluster, cluster.node_urls["n1"], adding))

    async def adopted() -> bool:
        return state.epoch == adding.epoch

    await eventually(adopted)
    await put_topology(cluster, n4_url, adding)
    async with cluster.http.post(
        cluster.node_urls["n1"] + wire.EXPORT_PATH,
        json={"keys": names, "topology": adding.to_dict()},
        headers=NODE_AUTH,
    ) as resp:
        assert resp.status == 200, await resp.text()
        [entry] = decode_entries((await resp.json())["entries"])
    assert second.done()  # the export waited for the batch ...
    [counted] = await second
    assert isinstance(counted, wire.Checked) and counted.limits[0].remaining == 8
    await adopt
    assert entry[1] == await source.dump(names[0])  # ... and hands out its count: 2
    await source.aclose()


async def test_an_abort_pulls_a_key_back_only_after_the_old_copy_step_moved_it(
    cluster: Cluster, fourth_redis: RedisProcess
) -> None:
    """An abort's new owner (the key's owner before the aborted migration) may still be
    moving that key away under the aborted migration when it serves the key again. Its
    first touch must wait for that move: pulled before it, the key looks absent at the
    aborted migration's target, the stale local copy is kept and then moved away, and
    its count is lost. Here the move is held back by pausing the owner's Redis for
    writes (MIGRATE is one; the copy's SCAN and the target's export only read)."""
    n4_url, before, adding, op = await add_n4_by_hand(cluster, fourth_redis)
    aborting = dataclasses.replace(
        before,
        epoch=before.epoch + 2,
        migration={"id": "mback", "from": adding.partitioner.to_dict(), "reverts": "madd"},
    )
    urls = {**cluster.node_urls, "n4": n4_url}
    for url in urls.values():
        await put_topology(cluster, url, adding)
    owner = aioredis.Redis(port=cluster.redis[0].port)
    state = cluster.runners[0].app[STATE]  # n1's
    await owner.client_pause(1500, all=False)  # writes only
    step = asyncio.create_task(
        cluster.http.post(
            urls["n1"] + wire.MIGRATE_PATH,
            json={"migration": "madd", "count": 100_000},
            headers=NODE_AUTH,
        )
    )

    async def moving() -> bool:
        return state.gate.in_flight(adding.epoch) == 1

    await eventually(moving)
    await put_topology(cluster, n4_url, aborting)
    adopt = asyncio.create_task(put_topology(cluster, urls["n1"], aborting))

    async def adopted() -> bool:
        return state.epoch == aborting.epoch

    await eventually(adopted)
    [again] = await node_batch(cluster, "n1", [op])
    assert isinstance(again, wire.Checked) and again.limits[0].remaining == 8
    await adopt
    async with await step as resp:
        assert resp.status == 200, await resp.text()
    [look] = await node_batch(cluster, "n1", [msgspec.structs.replace(op, cost=0)])
    assert isinstance(look, wire.Checked) and look.limits[0].remaining == 8
    await owner.aclose()


async def test_a_copy_step_answers_after_its_time_and_the_next_ones_move_the_rest(
    cluster: Cluster, fourth_redis: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a keys/s rate a step of every name would outlast the router's wait for it.
    A step answers once COPY_STEP_MAX_S has passed, with the cursor it got to, and the
    steps after it move exactly the rest."""
    monkeypatch.setattr(copy_step_module, "COPY_STEP_MAX_S", 0.2)
    # Chunks of 10 keys at 100 keys/s: the finder waits for the moves, as it does for a
    # whole copy's names under a rate.
    monkeypatch.setattr(migrator_module, "LANDED_GROUP", 10)
    monkeypatch.setattr(migrator_module, "MOVE_CHUNK", 10)
    n4_url, _before, adding, _op = await add_n4_by_hand(cluster, fourth_redis)
    await preload(cluster)
    for url in [*cluster.node_urls.values(), n4_url]:
        await put_topology(cluster, url, adding)
    n1 = sync_redis.Redis(port=cluster.redis[0].port)

    def moving_names() -> set[str]:
        names = (k.decode() for k in n1.scan_iter(match=DATA_KEYS_PATTERN, count=1000))
        return {
            name
            for name in names
            if (key := limit_key_of(name)) and adding.partitioner.owner(key) == "n4"
        }

    moving = moving_names()
    cursor, steps = 0, []
    while True:
        body = {"migration": "madd", "cursor": cursor, "count": 100_000, "rate": 100}
        async with cluster.http.post(
            cluster.node_urls["n1"] + wire.MIGRATE_PATH, json=body, headers=NODE_AUTH
        ) as resp:
            assert resp.status == 200, await resp.text()
            steps.append(await resp.json())
        cursor = steps[-1]["cursor"]
        if cursor == 0:
            break
    assert len(steps) > 1 and steps[0]["scanned"] < 100_000, steps
    assert sum(step["moved"] for step in steps) == len(moving) > 300
    assert moving_names() == set()
    n4 = sync_redis.Redis(port=fourth_redis.port)
    assert all(n4.exists(name) for name in moving)
    n4.close()
    n1.close()


LIMIT_10_PER_HOUR = {"algorithm": "fixed_window", "limit": 10, "window": "1h"}


async def test_a_source_whose_redis_is_gone_fails_only_its_own_moving_keys_at_the_target(
    cluster: Cluster, fourth_redis: RedisProcess
) -> None:
    """A migration's target imports a moving key on its first touch. With the key's
    previous owner's Redis gone (failing over, say), that check alone is answered
    unavailable: the batch's check of a key moving from a healthy node is served, and the
    target answers the batch (a router would otherwise take the whole target for down)."""
    n4_url, before, adding, op = await add_n4_by_hand(cluster, fourth_redis)
    from_n2 = next(
        k
        for k in (f"user:{i}" for i in range(1000))
        if before.partitioner.owner(k) == "n2" and adding.partitioner.owner(k) == "n4"
    )
    for url in [*cluster.node_urls.values(), n4_url]:
        await put_topology(cluster, url, adding)
    cluster.redis[0].stop()  # n1's; the next test's fixture starts it again
    [lost, served] = await batch_at(cluster, n4_url, [op, msgspec.structs.replace(op, key=from_n2)])
    assert isinstance(lost, wire.Expired), lost
    assert lost.unavailable.startswith("could not import moving keys from n1: ")
    assert isinstance(served, wire.Checked) and served.limits[0].remaining == 9
    # Through the router (it learns the migration from n1's `moved`): the check of the
    # key from n1 is degraded, the other one served, and n4 stays up.
    status, body = await cluster.post("/v1/check", {"key": op.key, "limits": [LIMIT_10_PER_HOUR]})
    assert body["degraded"] is True and body["node"] == "n4", body
    status, body = await cluster.post("/v1/check", {"key": from_n2, "limits": [LIMIT_10_PER_HOUR]})
    assert status == 200 and body["degraded"] is False, body
    assert body["limits"][0]["remaining"] == 8
    assert cluster.router.view.clients["n4"].state == "up"


async def test_first_touches_read_the_source_redis_once_the_source_answered_an_export(
    cluster: Cluster, fourth_redis: RedisProcess, tmp_path: Path
) -> None:
    """A node that takes a migrating topology asks each node it gains keys from for an
    export of no key, which fences the source (it takes the topology and drains its
    older batches); then its first touches read moving keys from the source's Redis
    straight, with their counts. A Redis that is no longer a primary (a failover demoted
    it) is never read: the export endpoint answers instead, and the source's Redis is
    read again once its address is learned anew."""
    n4_url, before, adding, op = await add_n4_by_hand(cluster, fourth_redis)
    moving = [
        k
        for k in (f"user:{i}" for i in range(1000, 3000))
        if before.partitioner.owner(k) == "n1" and adding.partitioner.owner(k) == "n4"
    ][:2]
    ops = [msgspec.structs.replace(op, key=key, cost=2) for key in moving]
    for counted in await node_batch(cluster, "n1", ops):
        assert isinstance(counted, wire.Checked) and counted.limits[0].remaining == 8
    for url in [*cluster.node_urls.values(), n4_url]:
        await put_topology(cluster, url, adding)
    [n4] = [
        r.app[STATE] for r in cluster.runners if STATE in r.app and r.app[STATE].node_id == "n4"
    ]
    sources = n4.migrator.sources
    n1 = adding.node("n1")
    assert n1 is not None

    async def ready() -> bool:
        return sources.ready(n1.urls, "madd")

    await eventually(ready)
    [first] = await batch_at(cluster, n4_url, [op])
    assert isinstance(first, wire.Checked) and first.limits[0].remaining == 8
    assert sources.reads == {"node": 0, "redis": 1}

    # n1's Redis address as n4 knows it now names a replica of it, as after a failover
    # that demoted it: ROLE says so, and the key comes through n1's export endpoint.
    replica = RedisProcess(port=free_port(), data_dir=tmp_path / "replica", aof=False)
    replica.start()
    try:
        follower = sync_redis.Redis(port=replica.port)
        follower.replicaof("127.0.0.1", cluster.redis[0].port)

        def synced() -> bool:
            return follower.info("replication").get("master_link_status") == "up"

        await eventually(lambda: asyncio.to_thread(synced))
        # As a primary's stats left it, before a failover demoted it (its run_id stays).
        demoted = (("127.0.0.1", replica.port, 0), follower.info("server")["run_id"])
        n4.peers._redis[n1.urls] = demoted  # the stale entry, on purpose
        [second] = await batch_at(cluster, n4_url, ops[:1])
        assert isinstance(second, wire.Checked) and second.limits[0].remaining == 6
        assert sources.reads == {"node": 1, "redis": 1}
        await eventually(ready)
        identity = await n4.peers.redis_identity(n1.urls)
        assert identity is not None and identity[0] == ("127.0.0.1", cluster.redis[0].port, 0)
        [third] = await batch_at(cluster, n4_url, ops[1:])
        assert isinstance(third, wire.Checked) and third.limits[0].remaining == 6
        assert sources.reads == {"node": 1, "redis": 2}
        follower.close()
    finally:
        replica.stop()


async def test_an_address_that_reaches_another_redis_from_here_is_never_used(
    cluster: Cluster, fourth_redis: RedisProcess
) -> None:
    """A shard's stats name its Redis as its node reaches it: a loopback address (a Redis
    beside the node in its pod) reaches another Redis from another host. Each node checks
    the run_id there against the stats' before using an address: the first touches and
    the background copy then go through the nodes, and every count arrives. Here each
    side's entry names its own Redis, as a loopback address would."""
    n4_url, before, adding, op = await add_n4_by_hand(cluster, fourth_redis)
    n1_redis = sync_redis.Redis(port=cluster.redis[0].port)
    owned = [f"user:{i}" for i in range(15_000) if before.partitioner.owner(f"user:{i}") == "n1"]
    moving = [k for k in owned if adding.partitioner.owner(k) == "n4" and k != op.key]
    assert len(moving) > 2 * LANDED_GROUP  # more than one move of the copy step
    name = next(iter(n1_redis.scan_iter(match="c*"))).decode().split("|", 1)[0]
    window_left = n1_redis.pttl(f"{name}|{op.key}")  # a fixed window's count: an integer
    with n1_redis.pipeline(transaction=False) as pipe:
        for key in owned:
            if key != op.key:
                pipe.set(f"{name}|{key}", 3, px=window_left)
        pipe.execute()
    [n1, n4] = [
        r.app[STATE]
        for node_id in ("n1", "n4")
        for r in cluster.runners
        if STATE in r.app and r.app[STATE].node_id == node_id
    ]
    n1_spec, n4_spec = adding.node("n1"), adding.node("n4")
    assert n1_spec is not None and n4_spec is not None
    n1_run_id = n1_redis.info("server")["run_id"]
    n4_run_id = sync_redis.Redis(port=fourth_redis.port).info("server")["run_id"]
    # What the stats of nodes with loopback `--redis` URLs would leave.
    n4.peers._redis[n1_spec.urls] = (("127.0.0.1", fourth_redis.port, 0), n1_run_id)
    n1.peers._redis[n4_spec.urls] = (("127.0.0.1", cluster.redis[0].port, 0), n4_run_id)
    for url in [*cluster.node_urls.values(), n4_url]:
        await put_topology(cluster, url, adding)

    [first] = await batch_at(cluster, n4_url, [msgspec.structs.replace(op, cost=2)])
    assert isinstance(first, wire.Checked) and first.limits[0].remaining == 7
    [other] = await batch_at(cluster, n4_url, [msgspec.structs.replace(op, key=moving[0])])
    assert isinstance(other, wire.Checked) and other.limits[0].remaining == 6
    assert n4.migrator.sources.reads == {"node": 2, "redis": 0}

    async with cluster.http.post(
        cluster.node_urls["n1"] + wire.MIGRATE_PATH,
        json={"migration": "madd", "count": 100_000},
        headers=NODE_AUTH,
    ) as resp:
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["cursor"] == 0
    n4_redis = sync_redis.Redis(port=fourth_redis.port, decode_responses=True)
    for key in moving:
        assert n1_redis.exists(f"{name}|{key}") == 0, key
    expected = {f"{name}|{key}": "3" for key in moving[1:]}
    expected[f"{name}|{moving[0]}"] = "4"
    held = dict(zip(expected, n4_redis.mget(list(expected)), strict=True))
    assert held == expected
    n1_redis.close()
    n4_redis.close()


async def test_a_migration_whose_lease_is_taken_stops_where_it_is(
    cluster: Cluster, fourth_redis: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the topology lease's TTL another router may start a change of its own: a
    migration whose lease went to another holder pauses and says so, and never copies."""
    n4_url = await add_spare_node(cluster, fourth_redis)
    resharder = cluster.router.resharder
    resharder.lease.ttl_ms = 900  # renewed every 0.3 s
    entered, released = asyncio.Event(), asyncio.Event()
    copied: list[bool] = []
    original = resharder._migrate

    async def held_back() -> None:  # the migration waits until the test lets it go
        entered.set()  # the lease is held and renewed from here on
        await released.wait()
        copied.append(True)
        await original()

    monkeypatch.setattr(resharder, "_migrate", held_back)
    lock = sync_redis.Redis(port=cluster.redis[0].port)  # n1 holds the topology lease
    adding = asyncio.ensure_future(
        cluster.post("/v1/cluster/nodes", {"url": n4_url, "id": "n4"}, ADMIN)
    )
    try:
        await asyncio.wait_for(entered.wait(), 10)
        assert lock.exists("sl|lease|topology")
        lock.set("sl|lease|topology", "another-router", px=5000)

        async def paused() -> bool:
            _, info = await cluster.get("/v1/cluster")
            migration = info["migration"] or {}
            return migration.get("phase") == "paused" and not migration.get("running")

        await eventually(paused, within=10)
        _, info = await cluster.get("/v1/cluster")
        assert info["migration"]["last_error"] == "another topology change holds the lease"
        status, problem = await adding
        assert status >= 400 and "another topology change holds the lease" in str(problem)
        assert copied == []
        assert lock.get("sl|lease|topology") == b"another-router"  # not released by us
    finally:
        released.set()
        if not adding.done():
            adding.cancel()
        lock.delete("sl|lease|topology")
        lock.close()
