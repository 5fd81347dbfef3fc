"""Prometheus metrics of a real cluster: the router's and every node's GET /metrics,
parsed with prometheus_client's own parser, and the Grafana dashboard's expressions."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from cluster.model.keys import NODE_SINGLETONS
from cluster.web.metrics import Families
from router.metrics import RouterMetrics
from tests.conftest import ADMIN, Cluster, eventually
from tests.support.metrics_scrape import scrape, value

DASHBOARD = Path(__file__).resolve().parents[2] / "compose" / "grafana" / "shardlimit.json"
INLINE_2 = [{"algorithm": "fixed_window", "limit": 2, "window": "1h"}]


def total(families: list[Metric], name: str) -> float:
    return sum(s.value for f in families for s in f.samples if s.name == name)


def label_values(families: list[Metric]) -> set[str]:
    return {v for f in families for s in f.samples for v in s.labels.values()}


async def node_families(cluster: Cluster) -> dict[str, list[Metric]]:
    return {node: await scrape(cluster.http, url) for node, url in cluster.node_urls.items()}


async def test_decisions_near_limit_and_latency_counts(cluster: Cluster) -> None:
    keys = ["metrics:user:1", "metrics:inline:1"]
    statuses = [(await cluster.check({"key": keys[0], "rule": "basic"}))[0] for _ in range(8)]
    assert statuses == [200] * 5 + [429] * 3
    for _ in range(2):
        status, _ = await cluster.check({"key": keys[1], "limits": INLINE_2})
        assert status == 200
    router = await scrape(cluster.http, cluster.router_url)
    decided = "shardlimit_decisions_total"
    assert value(router, decided, rule="basic", outcome="allowed") == 5
    assert value(router, decided, rule="basic", outcome="denied") == 3
    assert value(router, decided, rule="~inline", outcome="allowed") == 2
    assert total(router, decided) == 10
    # Near the limit: 4 and 5 of 5 used; 2 of 2 (not 1 of 2).
    assert value(router, "shardlimit_near_limit_decisions_total", rule="basic") == 2
    assert value(router, "shardlimit_near_limit_decisions_total", rule="~inline") == 1
    assert total(router, "shardlimit_degraded_decisions_total") == 0
    checks = "shardlimit_request_duration_seconds_count"
    assert value(router, checks, endpoint="/v1/check") == 10
    assert (
        value(router, "shardlimit_request_duration_seconds_bucket", endpoint="/v1/check", le="+Inf")
        == 10
    )
    # One check at a time: one batch of one op each, every one answered.
    assert total(router, "shardlimit_node_round_trip_seconds_count") == 10
    assert total(router, "shardlimit_node_batch_ops_count") == 10
    assert total(router, "shardlimit_node_batch_ops_sum") == 10
    nodes = await node_families(cluster)
    for node, families in nodes.items():
        sent = value(router, "shardlimit_node_requests_total", node=node)
        received = value(families, "shardlimit_node_received_batch_ops_count", node=node)
        assert received == sent
        # Each batch is one pipeline of script calls to the node's Redis.
        calls = value(families, "shardlimit_node_redis_call_duration_seconds_count", node=node)
        assert calls == sent
        buckets = [
            s
            for f in families
            for s in f.samples
            if s.name == "shardlimit_node_redis_call_duration_seconds_bucket"
        ]
        assert len(buckets) == 14 and buckets[-1].labels["le"] == "+Inf"
    # Cardinality: no label carries a limit key; rule labels are rule names.
    everything = [router, *nodes.values()]
    assert not set(keys) & set().union(*(label_values(f) for f in everything))
    rules = {s.labels["rule"] for f in router for s in f.samples if "rule" in s.labels}
    assert rules == {"basic", "~inline"}


async def test_unmatched_paths_are_one_endpoint(cluster: Cluster) -> None:
    for path in ("/no/such/user:42", "/v1/usage?key=secret:1"):
        async with cluster.http.get(cluster.router_url + path) as resp:
            assert resp.status in (400, 404)
    router = await scrape(cluster.http, cluster.router_url)
    endpoints = {s.labels["endpoint"] for f in router for s in f.samples if "endpoint" in s.labels}
    assert endpoints == {"unmatched", "/v1/usage"}
    assert value(router, "shardlimit_error_responses_total", status="404") == 1
    assert value(router, "shardlimit_error_responses_total", status="400") == 1
    assert "secret:1" not in label_values(router)


async def test_node_keys_gauge_is_the_redis_key_count(cluster: Cluster) -> None:
    for i in range(30):
        await cluster.check({"key": f"metrics:keys:{i}", "rule": "pair"})
    _, info = await cluster.get("/v1/cluster")
    stats_keys = {n["id"]: n["keys"] for n in info["nodes"]}
    nodes = await node_families(cluster)
    counted = 0
    for index, (node, families) in enumerate(sorted(nodes.items())):
        client = aioredis.Redis(port=cluster.redis[index].port)
        try:
            held = await client.dbsize() - await client.exists(*NODE_SINGLETONS)
        finally:
            await client.aclose()
        assert value(families, "shardlimit_node_keys", node=node) == held == stats_keys[node]
        assert value(families, "shardlimit_node_redis_up", node=node) == 1
        # A lone Redis: the primary, with no replica and no failover to follow.
        assert value(families, "shardlimit_node_redis_is_primary", node=node) == 1
        assert value(families, "shardlimit_node_redis_replicas_up", node=node) == 0
        assert value(families, "shardlimit_node_failovers_total", node=node) == 0
        shown = next(n["redis"] for n in info["nodes"] if n["id"] == node)
        port = cluster.redis[index].port
        assert shown == {
            "replicated": False,
            "primary": f"127.0.0.1:{port}",
            "role": "master",
            "replicas": [],
            "failovers": 0,
        }
        assert value(families, "shardlimit_node_topology_epoch", node=node) == 1
        counted += held
    assert counted == 30 * 2  # two counters per key


async def test_node_up_and_breaker_follow_a_stopped_node(cluster: Cluster) -> None:
    victim = "n2"
    key = next(
        f"metrics:down:{i}"
        for i in range(1000)
        if cluster.router.view.owner(f"metrics:down:{i}") == victim
    )
    router = await scrape(cluster.http, cluster.router_url)
    assert value(router, "shardlimit_node_up", node=victim) == 1
    assert value(router, "shardlimit_node_breaker_open", node=victim) == 0
    await cluster.runners[1].cleanup()  # node n2's HTTP server
    status, body = await cluster.check({"key": key, "rule": "basic"})
    assert status == 200 and body["degraded"] is True

    async def marked_down() -> bool:
        families = await scrape(cluster.http, cluster.router_url)
        return value(families, "shardlimit_node_up", node=victim) == 0

    await eventually(marked_down)
    router = await scrape(cluster.http, cluster.router_url)
    assert value(router, "shardlimit_node_breaker_open", node=victim) == 1
    assert value(router, "shardlimit_node_breaker_opened_total", node=victim) == 1
    assert [value(router, "shardlimit_node_up", node=n) for n in ("n1", "n3")] == [1, 1]
    assert (
        value(router, "shardlimit_decisions_total", rule="basic", outcome="degraded_allowed") == 1
    )
    reason = body["degraded_reason"].split(":")[0]
    assert value(router, "shardlimit_degraded_decisions_total", rule="basic", reason=reason) == 1


async def test_rules_reloads_count_by_result(cluster: Cluster) -> None:
    assert cluster.rules_file is not None
    reloads = "shardlimit_rules_reloads_total"
    router = await scrape(cluster.http, cluster.router_url)
    ok, error = value(router, reloads, result="ok"), value(router, reloads, result="error")
    assert ok >= 1 and error == 0
    good = cluster.rules_file.read_text() + "  extra:\n    limits: 3/minute\n"
    # Written and reloaded in one step of the loop: the poller cannot read it in between,
    # and sees it unchanged afterwards.
    cluster.rules_file.write_text(good)
    cluster.router.reload_rules()
    router = await scrape(cluster.http, cluster.router_url)
    assert [value(router, reloads, result=r) for r in ("ok", "error")] == [ok + 1, 0]
    cluster.rules_file.write_text("rules: [not, a, mapping\n")
    cluster.router.reload_rules()
    router = await scrape(cluster.http, cluster.router_url)
    assert [value(router, reloads, result=r) for r in ("ok", "error")] == [ok + 1, 1]


async def test_migration_counts_moved_keys(cluster: Cluster) -> None:
    keys = [f"metrics:move:{i}" for i in range(40)]
    on_n3 = [k for k in keys if cluster.router.view.owner(k) == "n3"]
    for key in keys:
        await cluster.check({"key": key, "rule": "basic"})
    async with cluster.http.delete(
        cluster.router_url + "/v1/cluster/nodes/n3", headers={"Authorization": f"Bearer {ADMIN}"}
    ) as resp:
        assert resp.status == 202, await resp.text()
    migration: dict[str, Any] = {}

    async def done() -> bool:
        _, info = await cluster.get("/v1/cluster")
        migration.update(info["migration"] or {})
        return migration.get("phase") == "done" and not migration["running"]

    await eventually(done, within=60)
    assert migration["keys_moved"] == len(on_n3) > 0  # one counter per key
    router = await scrape(cluster.http, cluster.router_url)
    assert value(router, "shardlimit_migration_moved_keys_total") == len(on_n3)
    assert value(router, "shardlimit_migration_in_progress") == 0
    assert value(router, "shardlimit_migration_sources_done_ratio") == 1
    scanned = [
        s for f in router for s in f.samples if s.name == "shardlimit_migration_scanned_keys"
    ]
    assert {s.labels["node"] for s in scanned} == {"n1", "n2", "n3"}
    n3 = await scrape(cluster.http, cluster.node_urls["n3"])
    assert value(n3, "shardlimit_node_migrated_keys_total", node="n3", kind="copied") == len(on_n3)
    assert value(n3, "shardlimit_node_keys", node="n3") == 0


def _exposed_names(families: list[Metric]) -> set[str]:
    """Every series name a family can have, samples or not yet (a labelled counter
    shows none until first used)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
    names: set[str] = set()
    for family in families:
        names.add(family.name)
        names.update(family.name + s for s in suffixes.get(family.type, ()))
        names.update(s.name for s in family.samples)
    return names


def dashboard_metric_names() -> set[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 10
    return {name for expr in exprs for name in re.findall(r"\bshardlimit_\w+", expr)}


async def test_dashboard_names_only_exposed_metrics(cluster: Cluster) -> None:
    await cluster.check({"key": "metrics:board", "rule": "basic"})
    exposed = _exposed_names(await scrape(cluster.http, cluster.router_url))
    for families in (await node_families(cluster)).values():
        exposed |= _exposed_names(families)
    named = dashboard_metric_names()
    assert named - exposed == set()
    assert {
        "shardlimit_near_limit_decisions_total",
        "shardlimit_node_keys",
        "shardlimit_node_redis_call_duration_seconds_bucket",
    } <= named


def test_histogram_buckets_are_inclusive_upper_bounds() -> None:
    registry = CollectorRegistry()
    seconds = Families(registry).histogram("t_seconds", "Test.", (0.5, 1.0), "stage")
    for observed in (0.5, 0.75, 1.0, 3.0):
        seconds("a").observe(observed)
    families = list(text_string_to_metric_families(generate_latest(registry).decode()))
    buckets = [(s.labels["le"], s.value) for s in families[0].samples if s.name.endswith("_bucket")]
    assert buckets == [("0.5", 1), ("1.0", 3), ("+Inf", 4)]
    assert value(families, "t_seconds_count", stage="a") == 4
    assert value(families, "t_seconds_sum", stage="a") == 5.25


def test_routers_in_one_process_have_registries_of_their_own() -> None:
    first, second = RouterMetrics(), RouterMetrics()
    first.decisions("basic", "allowed").inc()
    assert first.count("shardlimit_decisions_total") == 1
    assert second.count("shardlimit_decisions_total") == 0
