"""Resharding between replicated shards survives a failover of either side: a primary
SIGKILLed while a node removal moves its keys (the source's shard, or a target's) is
replaced by its replica, the migration goes on (resumed if it paused), and every key
ends on its new owner with exactly the count admitted before: nothing lost (a key is
dropped at its source only once a replica of its target holds it), nothing counted
twice. Each count was acknowledged under `durability: replica` (a quota's default)."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis as sync_redis

from cluster.local.cluster import LocalCluster, scratch_cluster
from cluster.local.sentinel_proc import ask, sentinel_master
from cluster.model.keys import limit_key_of
from cluster.model.topology import Topology
from tests.conftest import eventually

pytestmark = [pytest.mark.system, pytest.mark.timeout(120)]
ADMIN = "failover-migration-admin"
STOCK = [{"algorithm": "quota", "limit": 1000}]  # durability replica by default
KEYS = [f"sku:{i}" for i in range(3000)]
# Slow enough to interrupt: a step examines 50 keys, the copy moves 150 keys/s.
SLOW_COPY = {"reshard_step_keys": 50, "reshard_rate": 150}


def _role(host: str, port: int) -> str | None:
    role = ask(host, port, "ROLE")
    return None if role is None else str(role[0].decode())


def _online_replicas(host: str, port: int) -> int:
    info = ask(host, port, "INFO", "replication") or {}
    replicas = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
    return sum(1 for replica in replicas if replica.get("state") == "online")


async def _until(condition: Callable[[], bool], within: float) -> None:
    async def check() -> bool:
        return condition()

    await eventually(check, within=within)


async def _fill(http: aiohttp.ClientSession, router: str) -> dict[str, int]:
    rng = random.Random(5)
    used = {key: rng.randint(1, 3) for key in KEYS}
    for start in range(0, len(KEYS), 500):
        checks = [{"key": k, "limits": STOCK, "cost": used[k]} for k in KEYS[start : start + 500]]
        async with http.post(router + "/v1/check/batch", json={"checks": checks}) as resp:
            body = await resp.json()
        assert resp.status == 200, body
        assert all(r["allowed"] and not r.get("degraded") for r in body["results"]), body
    return used


async def _topology(http: aiohttp.ClientSession, local: LocalCluster, index: int) -> Topology:
    headers = {"Authorization": f"Bearer {local.cluster_token}"}
    async with http.get(local.node_url(index) + "/node/v1/topology", headers=headers) as resp:
        return Topology.from_dict(await resp.json())


async def _migration(http: aiohttp.ClientSession, router: str) -> dict[str, Any]:
    async with http.get(router + "/v1/cluster") as resp:
        info: dict[str, Any] = await resp.json()
    return info.get("migration") or {}


async def _admin(http: aiohttp.ClientSession, method: str, url: str) -> None:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with http.request(method, url, headers=headers) as resp:
        assert resp.status == 202, await resp.text()


def _primary(local: LocalCluster, node_id: str) -> tuple[str, int]:
    assert local.replication is not None
    found = sentinel_master(local.replication.sentinels, node_id)
    assert found is not None
    return found


def _holders(local: LocalCluster) -> dict[str, list[str]]:
    """limit key -> the nodes whose current primary holds a counter of it."""
    found: dict[str, list[str]] = {}
    for spec in local.members:
        host, port = _primary(local, spec.id)
        client = sync_redis.Redis(host=host, port=port)
        for name in client.scan_iter(match="c*", count=1000):
            key = limit_key_of(name.decode())
            if key is not None:
                found.setdefault(key, []).append(spec.id)
        client.close()
    return found


def _ready_to_fail_over(local: LocalCluster, node_id: str) -> bool:
    """Every Sentinel knows the shard's replica and the two other Sentinels."""
    assert local.replication is not None
    return all(
        len(ask(s.host, s.port, "SENTINEL", "REPLICAS", node_id) or []) == 1
        and len(ask(s.host, s.port, "SENTINEL", "SENTINELS", node_id) or []) == 2
        for s in local.replication.sentinels
    )


async def _fail_over_lagging(
    local: LocalCluster, node_id: str, lagged: Callable[[], Awaitable[bool]]
) -> None:
    """The shard of `node_id` loses its replica's stream (SIGSTOP, then its connection
    killed: what the primary writes from then on reaches no replica) until `lagged`;
    then its primary is SIGKILLed, the replica comes back and is promoted, and the old
    primary starts again as its replica (a shard with no replica could acknowledge
    neither `durability: replica` checks nor a migration's keys)."""
    assert local.replication is not None
    primary = local.redis[[spec.id for spec in local.members].index(node_id)]
    [replica] = local.replication.shards[node_id]
    replica.pause()
    try:
        assert ask(primary.host, primary.port, "CLIENT", "KILL", "TYPE", "replica") == 1
        await eventually(lagged, within=30)
        primary.kill()
    finally:
        replica.resume()
    sentinels = local.replication.sentinels

    def promoted() -> bool:
        return all(sentinel_master([s], node_id) == (replica.host, replica.port) for s in sentinels)

    await _until(promoted, within=45)
    await _until(lambda: _role(replica.host, replica.port) == "master", within=10)
    local.replication.respawn(node_id, primary)

    def settled() -> bool:
        """The Sentinels agree on a primary that has a replica online (a Sentinel that
        saw the promoted replica down while it was stopped may fail it over again, to
        the returning process)."""
        masters = {sentinel_master([s], node_id) for s in sentinels}
        master = masters.pop() if len(masters) == 1 else None
        return master is not None and _role(*master) == "master" and _online_replicas(*master) >= 1

    await _until(settled, within=45)


async def _finish(http: aiohttp.ClientSession, router: str) -> dict[str, Any]:
    """Await the migration's end, resuming it whenever it paused (a step that failed
    five times: a shard without a primary, or without a replica to acknowledge)."""
    resumed = 0
    final: dict[str, Any] = {}

    async def done() -> bool:
        nonlocal resumed
        migration = await _migration(http, router)
        if migration.get("phase") == "done" and not migration.get("running"):
            final.update(migration)
            return True
        if migration and not migration.get("running"):
            resumed += 1
            await _admin(http, "POST", router + "/v1/cluster/migration/resume")
        return False

    await eventually(done, within=60)
    final["resumed"] = resumed
    return final


async def _serving(http: aiohttp.ClientSession, router: str, keys: list[str]) -> None:
    """Await durable checks of `keys` answered again: a node whose primary was just
    promoted answers them degraded until it sees a replica acknowledging the new
    primary's stream, which may be after the Sentinels report the replica online."""

    async def answered() -> bool:
        checks = [{"key": k, "limits": STOCK, "cost": 0} for k in keys]
        async with http.post(router + "/v1/check/batch", json={"checks": checks}) as resp:
            body = await resp.json()
        return not any(result.get("degraded") for result in body["results"])

    await eventually(answered, within=20)


@pytest.mark.parametrize("victim", ["n3", "n1"], ids=["source", "target"])
async def test_a_migration_survives_a_failover_of_its_source_or_target(
    tmp_path: Path, victim: str
) -> None:
    with scratch_cluster(
        3,
        admin_token=ADMIN,
        data_dir=tmp_path / "c",
        replicas=1,
        router_settings=SLOW_COPY,
    ) as local:
        assert local.replication is not None
        async with aiohttp.ClientSession() as http:
            router = local.router_url
            used = await _fill(http, router)
            before = (await _topology(http, local, 0)).partitioner
            await _until(lambda: _ready_to_fail_over(local, victim), within=30)
            # Removing n3 moves its keys to n1 and n2: n3 is the source, n1 a target.
            await _admin(http, "DELETE", router + "/v1/cluster/nodes/n3")

            async def moved() -> int:
                return int((await _migration(http, router)).get("keys_moved", 0))

            async def midway() -> bool:
                return await moved() >= 150

            await eventually(midway, within=30)
            assert (await _migration(http, router)).get("phase") == "copying"
            cut_off = await moved()

            async def lagged() -> bool:
                """The copy went on (100 keys more), or it is held up: a copy step
                failed (no replica acknowledged what it moved)."""
                if (await _migration(http, router)).get("blocked"):
                    return True
                return await moved() >= cut_off + 100

            await _fail_over_lagging(local, victim, lagged)
            final = await _finish(http, router)
            print(
                f"{victim} failed over: {final['keys_moved']} keys moved, {final['resumed']} resumes"
            )

            after = (await _topology(http, local, 0)).partitioner
            await _serving(
                http,
                router,
                [next(k for k in KEYS if after.owner(k) == n) for n in ("n1", "n2")],
            )
            assert [n.id for n in after.nodes] == ["n1", "n2"]
            moving = [k for k in KEYS if before.owner(k) == "n3"]
            assert moving and all(after.owner(k) != "n3" for k in moving)
            for start in range(0, len(KEYS), 500):
                chunk = KEYS[start : start + 500]
                checks = [{"key": k, "limits": STOCK, "cost": 0} for k in chunk]
                async with http.post(router + "/v1/check/batch", json={"checks": checks}) as resp:
                    body = await resp.json()
                for key, result in zip(chunk, body["results"], strict=True):
                    assert not result.get("degraded"), (key, result.get("degraded_reason"))
                    assert result["limits"][0]["remaining"] == 1000 - used[key], key
            # Each counter lives on exactly one shard: its new owner's (none left on n3).
            holders = _holders(local)
            assert sorted(holders) == sorted(KEYS)
            wrong = {k: v for k, v in holders.items() if v != [after.owner(k)]}
            assert wrong == {}
