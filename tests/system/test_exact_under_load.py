"""Exact under load: bursts from another process on a healthy cluster of real processes
answer nothing degraded and admit exactly the limit; a node, or a node's Redis, hung past
its batches' deadlines applies none of them once it runs again.

The load comes from `cluster.local.loadgen` in a child process (never from the pytest
process, whose event loop would measure itself), with 128 or more connections.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.chaos_scenarios import CLUSTER_TOKEN, WINDOW, ChaosCluster
from cluster.local.loadgen import run_loadgen, start_loadgen
from cluster.local.procs import until

# Windows so long that no run straddles a boundary (fixed windows align to the epoch).
HOT = {"algorithm": "fixed_window", "limit": 2000, "window": "3660d"}
FEW = {"algorithm": "fixed_window", "limit": 3, "window": "3660d"}
MONEY = {"algorithm": "calendar", "period": "year", "timezone": "UTC", "max_amount": "100.00"}


@pytest.fixture
async def processes(tmp_path: Path) -> AsyncIterator[ChaosCluster]:
    cluster = await ChaosCluster.start(tmp_path / "exact", appendfsync="everysec")
    try:
        yield cluster
    finally:
        await cluster.close()


def tag() -> str:
    return uuid.uuid4().hex[:8]


async def read_limits(
    cluster: ChaosCluster, keys: list[str], limits: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each key's first limit view, read with cost 0 (consumes nothing)."""
    views: list[dict[str, Any]] = []
    for start in range(0, len(keys), 1000):
        checks = [{"key": k, "limits": limits, "cost": 0} for k in keys[start : start + 1000]]
        async with cluster.http.post(
            cluster.router_url + "/v1/check/batch", json={"checks": checks}
        ) as resp:
            assert resp.status == 200
            results = (await resp.json())["results"]
        assert [r for r in results if r["degraded"]] == []
        views += [r["limits"][0] for r in results]
    return views


def assert_clean(report: dict[str, Any]) -> None:
    assert report["errors"] == 0, report["error_samples"]
    assert report["degraded"] == 0, report["degraded_reasons"]
    assert report["answered"] == report["requests"]


@pytest.mark.timeout(120)
async def test_burst_on_one_hot_key_admits_exactly_the_limit(processes: ChaosCluster) -> None:
    key = f"hot:{tag()}"
    body = orjson.dumps({"key": key, "limits": [HOT]}).decode()
    report = await run_loadgen(
        processes.router_url + "/v1/check", connections=128, body=body, requests=3000
    )
    assert_clean(report)
    assert report["allowed"] == 2000 and report["denied"] == 1000
    assert report["status"] == {"200": 2000, "429": 1000}
    [view] = await read_limits(processes, [key], [HOT])
    assert view["remaining"] == 0
    print(f"hot key: {report['rate_per_s']:.0f}/s, p99 {report['latency_ms']['p99']} ms")


@pytest.mark.timeout(120)
async def test_burst_on_a_money_quota_admits_exactly_its_amount(processes: ChaosCluster) -> None:
    key = f"merchant:{tag()}"
    body = orjson.dumps({"key": key, "limits": [MONEY], "amount": "0.10"}).decode()
    report = await run_loadgen(
        processes.router_url + "/v1/check", connections=128, body=body, requests=1100
    )
    assert_clean(report)
    assert report["allowed"] == 1000 and report["denied"] == 100
    [view] = await read_limits(processes, [key], [MONEY])
    assert view["amount_remaining"] == "0.00"
    print(f"money: {report['rate_per_s']:.0f}/s, p99 {report['latency_ms']['p99']} ms")


@pytest.mark.timeout(180)
async def test_burst_over_5000_keys_admits_what_the_counters_hold(
    processes: ChaosCluster,
) -> None:
    prefix = f"many:{tag()}"
    body = orjson.dumps({"key": prefix + ":{i}", "limits": [FEW]}).decode()
    report = await run_loadgen(
        processes.router_url + "/v1/check",
        connections=128,
        body=body,
        requests=16_000,
        keys=5000,
        per_key=True,
    )
    assert_clean(report)
    keys = [f"{prefix}:{i}" for i in range(5000)]
    views = await read_limits(processes, keys, [FEW])
    held = {k: 3 - v["remaining"] for k, v in zip(keys, views, strict=True)}
    admitted = report["allowed_by_key"]
    assert sum(held.values()) == report["allowed"] == 15_000
    assert {k: n for k, n in held.items() if n} == admitted
    print(f"5000 keys: {report['rate_per_s']:.0f}/s, p99 {report['latency_ms']['p99']} ms")


async def node_stats(cluster: ChaosCluster, index: int) -> dict[str, Any]:
    url = f"http://127.0.0.1:{cluster.node_ports[index]}/node/v1/stats"
    headers = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}
    async with cluster.http.get(url, headers=headers) as resp:
        assert resp.status == 200
        stats: dict[str, Any] = await resp.json()
        return stats


async def serving_again(cluster: ChaosCluster, victim: str) -> None:
    """Until the router has sent the victim 50 more batches: the load reaches it again."""
    served = (await cluster.metrics())["shardlimit_node_requests_total"][victim]

    async def serving() -> bool:
        return (await cluster.metrics())["shardlimit_node_requests_total"][victim] > served + 50

    await until(serving, 30, "victim serving again")


@pytest.mark.timeout(120)
async def test_node_hung_past_its_deadlines_applies_nothing_it_did_not_answer(
    processes: ChaosCluster,
) -> None:
    """SIGSTOP a node with batches in flight; keep it stopped until the router gave up on
    them (deadline + margin); SIGCONT: counters hold exactly what was admitted."""
    cluster = processes
    prefix = f"stop:{tag()}"
    keys = [f"{prefix}:{i}" for i in range(60)]
    body = orjson.dumps({"key": prefix + ":{i}", "rule": WINDOW}).decode()
    load = await start_loadgen(
        cluster.router_url + "/v1/check", connections=128, body=body, keys=60, per_key=True
    )
    victim = cluster.node_id(0)
    try:

        async def flowing() -> bool:
            return (await cluster.metrics())["shardlimit_node_requests_total"][victim] >= 200

        await until(flowing, 30, "load reaching the victim")
        cluster.nodes[0].pause()

        async def given_up() -> bool:
            metrics = await cluster.metrics()
            return (
                metrics["shardlimit_node_timeouts_total"][victim] >= 1
                and metrics["shardlimit_node_up"][victim] == 0
            )

        # The router gives up on a batch only at its deadline + margin: from then on,
        # every op the stopped node still holds is past its deadline.
        await until(given_up, 30, "router gave up on the victim's batches")
        cluster.nodes[0].resume()

        async def back() -> bool:
            return (await cluster.metrics())["shardlimit_node_up"][victim] == 1

        await until(back, 30, "victim back up")
        await serving_again(cluster, victim)
    finally:
        report = await load.stop()
    assert report["errors"] == 0, report["error_samples"]
    assert report["degraded"] > 0  # the hang was seen by clients
    stats = await node_stats(cluster, 0)
    # The stopped node found late work when it ran again: batches that arrived past
    # their deadline were answered `expired`, results ready too late were taken back.
    assert stats["expired_batches"] >= 1
    admitted = report["allowed_by_key"]
    for key in keys:
        used, _ = await cluster.usage(key, WINDOW)
        assert used == admitted.get(key, 0), (key, cluster.owner(key))
    print(
        f"hung node: {report['degraded']} degraded answers, node found "
        f"{stats['expired_batches']} late batches, took back {stats['undone_checks']} checks"
    )


@pytest.mark.timeout(120)
async def test_redis_hung_past_its_batches_deadlines_applies_nothing_it_did_not_answer(
    processes: ChaosCluster,
) -> None:
    """SIGSTOP a node's Redis with batches in flight. The node stays up and waits for its
    Redis; the router sends a batch with no answer by its deadline plus the margin again
    (3 times) while the node is up, then answers its checks degraded `timeout`. SIGCONT
    once a check has been answered so: the scripts Redis then runs apply nothing past
    their deadline, so the counters hold exactly what was admitted, and only the hung
    shard's keys were degraded."""
    cluster = processes
    prefix = f"rstop:{tag()}"
    keys = [f"{prefix}:{i}" for i in range(60)]
    victim = cluster.node_id(0)
    assert 0 < sum(cluster.owner(key) == victim for key in keys) < len(keys)
    probe = next(key for i in range(1000) if cluster.owner(key := f"{prefix}:probe:{i}") == victim)
    body = orjson.dumps({"key": prefix + ":{i}", "rule": WINDOW}).decode()
    load = await start_loadgen(
        cluster.router_url + "/v1/check", connections=128, body=body, keys=60, per_key=True
    )
    try:

        async def flowing() -> bool:
            return (await cluster.metrics())["shardlimit_node_requests_total"][victim] >= 200

        await until(flowing, 30, "load reaching the victim")
        cluster.redis[0].pause()
        # Sent after the load's checks of the victim's keys, answered after them too.
        async with cluster.http.post(
            cluster.router_url + "/v1/check", json={"key": probe, "rule": WINDOW}
        ) as resp:
            answer = await resp.json()
        assert answer["degraded"] and answer["degraded_reason"].startswith("timeout:"), answer
        metrics = await cluster.metrics()
        assert metrics["shardlimit_node_up"][victim] == 1  # its process answers: up
        assert metrics["shardlimit_node_timeouts_total"][victim] >= 4  # the probe's 4 sends
        cluster.redis[0].resume()
        await serving_again(cluster, victim)
    finally:
        report = await load.stop()
    assert report["errors"] == 0, report["error_samples"]
    reasons = report["degraded_reasons"]
    # Only the hung shard's checks were degraded (each reason names its node).
    hung = f"timeout: node {victim}:"
    assert report["degraded"] > 0 and all(r.startswith(hung) for r in reasons), reasons
    admitted = report["allowed_by_key"]
    assert set(admitted) == set(keys)  # every key, the hung shard's too, was served
    for key in keys:
        used, _ = await cluster.usage(key, WINDOW)
        assert used == admitted[key], (key, cluster.owner(key))
    assert await cluster.usage(probe, WINDOW) == (0, 0)
    stats = await node_stats(cluster, 0)
    print(
        f"hung Redis: {report['degraded']} degraded answers, node found "
        f"{stats['expired_batches']} late batches, took back {stats['undone_checks']} checks"
    )
