"""Operational endpoints and storage hygiene."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import redis
import yaml

from cluster import wire
from cluster.local.redis_proc import RedisProcess, free_port
from cluster.model.keys import NODE_SINGLETONS, RULES_KEY
from node.app import STATE
from tests.conftest import CLUSTER, Cluster, eventually


async def test_every_redis_key_has_a_ttl(cluster: Cluster) -> None:
    limits = [
        {"algorithm": "fixed_window", "limit": 5, "window": "1m"},
        {"algorithm": "sliding_log", "limit": 5, "window": "1m"},
        {"algorithm": "sliding_window", "limit": 5, "window": "1m"},
        # Hour-long bucket periods: a bucket whose state refills within the run (200 ms
        # at 5/s) rightly expires before the scan on a slow machine.
        {"algorithm": "token_bucket", "rate": 5, "period": "1h"},
        {"algorithm": "leaky_bucket", "rate": 5, "period": "1h"},
        {"algorithm": "calendar", "period": "week", "timezone": "Asia/Tokyo", "max_count": 9},
    ]
    for i in range(30):
        await cluster.check({"key": f"ttl:{i}", "limits": limits, "request_id": f"id{i}"})
    total = 0
    for server in cluster.redis:
        client = redis.Redis(port=server.port)
        for key in client.scan_iter(count=1000):
            if key.decode() in NODE_SINGLETONS:
                continue  # the cluster's rules, the node's topology: one per node, for good
            total += 1
            assert client.pttl(key) > 0, key
        assert client.exists(RULES_KEY) == 1
        client.close()
    assert total == 30 * 7  # six counters and one idempotency record per key


async def test_cluster_locate_metrics_openapi(cluster: Cluster) -> None:
    for i in range(60):
        await cluster.check({"key": f"m:{i}", "rule": "basic"})
    status, info = await cluster.get("/v1/cluster")
    assert status == 200 and info["epoch"] == 1 and info["partitioner"] == "ring"
    assert sum(n["keys"] for n in info["nodes"]) == 60
    assert abs(sum(n["share"] for n in info["nodes"]) - 1) < 1e-4
    assert all(n["state"] == "up" for n in info["nodes"])
    status, loc = await cluster.get("/v1/locate?key=m:1")
    assert status == 200 and loc["node"] == cluster.router.view.owner("m:1")
    assert isinstance(loc["point"], int)
    async with cluster.http.get(cluster.router_url + "/metrics") as resp:
        text = await resp.text()
    assert 'shardlimit_decisions_total{outcome="allowed",rule="basic"} 60.0' in text
    assert "shardlimit_topology_epoch 1.0" in text
    status, doc = await cluster.get("/openapi.json")
    assert doc["openapi"].startswith("3.1")
    assert {"/v1/check", "/v1/check/batch", "/v1/refund", "/v1/usage", "/v1/locate"} <= set(
        doc["paths"]
    )
    status, health = await cluster.get("/healthz")
    assert status == 200 and health == {"status": "ok"}


async def test_node_without_topology_is_brought_up_to_date(cluster: Cluster) -> None:
    # As after a node restart: it owns nothing until the router pushes the topology.
    for runner in cluster.runners[:3]:
        runner.app[STATE].topology = None
    status, body = await cluster.check({"key": "moved:1", "rule": "basic"})
    assert status == 200 and body["degraded"] is False
    assert cluster.router.view.moved_retries == 1


async def test_node_endpoints_need_the_cluster_token(cluster: Cluster) -> None:
    url = next(iter(cluster.node_urls.values())) + wire.BATCH_PATH
    op = wire.Op("check", "k", "~inline", [], [], cost=1)
    body = wire.encode(wire.Batch(int(time.time() * 1000) + 5000, [op]))
    async with cluster.http.post(url, data=body) as resp:
        assert resp.status == 401
    headers = {"Authorization": "Bearer wrong"}
    async with cluster.http.post(url, data=body, headers=headers) as resp:
        assert resp.status == 401
    headers = {"Authorization": f"Bearer {CLUSTER}"}
    async with cluster.http.post(url, data=body, headers=headers) as resp:
        assert resp.status == 200
        [result] = wire.decode_reply(await resp.read()).results
        assert isinstance(result, wire.Failed)
    # Not a batch: a clear 400, nothing run.
    async with cluster.http.post(url, data=b"\x93junk", headers=headers) as resp:
        assert resp.status == 400


def test_sighup_reloads_rules_in_a_router_process(
    redis_servers: list[RedisProcess], tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules: {}\n")
    port = free_port()
    config = {
        "router": {
            "port": port,
            "data_dir": str(tmp_path / "router"),
            "rules_file": str(rules),
            "rules_poll": "1h",  # only SIGHUP can make it notice
        },
        "cluster": {"nodes": [{"id": "n1", "url": "http://127.0.0.1:1"}]},
    }
    config_path = tmp_path / "cluster.yaml"
    config_path.write_text(yaml.safe_dump(config))
    env = dict(os.environ, SHARDLIMIT_ADMIN_TOKEN="a", SHARDLIMIT_CLUSTER_TOKEN="c")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cluster.cli", "serve", "router", "--config", str(config_path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:

            async def rules_count() -> int:
                async with http.get(f"http://127.0.0.1:{port}/v1/rules") as resp:
                    return len((await resp.json())["rules"])

            async def up() -> bool:
                try:
                    return await rules_count() == 0
                except aiohttp.ClientError:
                    return False

            await eventually(up, within=20)
            rules.write_text(
                "rules:\n  r:\n    limits:\n      - {algorithm: fixed_window, limit: 1, window: 1s}\n"
            )
            assert await rules_count() == 0
            proc.send_signal(signal.SIGHUP)

            async def reloaded() -> bool:
                return await rules_count() == 1

            await eventually(reloaded)

    try:
        asyncio.run(scenario())
    finally:
        proc.terminate()
        proc.wait(10)
    assert proc.returncode == 0
    assert json.loads((tmp_path / "router" / "topology.json").read_text())["epoch"] == 1


async def test_checks_survive_a_flushed_script_cache(cluster: Cluster) -> None:
    """Nodes send EVALSHA only; a Redis that lost its scripts gets them again."""
    limits = [{"algorithm": "fixed_window", "limit": 3, "window": "1h"}]
    statuses = [(await cluster.check({"key": "flushed", "limits": limits}))[0] for _ in range(2)]
    for server in cluster.redis:
        client = redis.Redis(port=server.port)
        client.script_flush()
        client.close()
    statuses += [(await cluster.check({"key": "flushed", "limits": limits}))[0] for _ in range(2)]
    assert statuses == [200, 200, 200, 429]


def test_example_rules_serve_the_readme() -> None:
    """`make run` serves configs/rules.yaml: every rule the README's examples use is there."""
    from router.rules.book import parse_rules_document

    root = Path(__file__).resolve().parents[2]
    rules = parse_rules_document(yaml.safe_load((root / "configs" / "rules.yaml").read_text()))
    assert set(rules) >= {"api", "basic", "login", "ocr", "payments", "search", "uploads"}
    assert [lim.period for lim in rules["ocr"].limits] == ["day", "hour"]
    assert rules["payments"].on_failure == "deny"
