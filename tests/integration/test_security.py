"""Hostile callers: every write needs the admin token, keys are only ever data."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from cluster.model.limits import MAX_LIMITS_PER_RULE
from tests.conftest import ADMIN, CLUSTER, Cluster

FW = {"algorithm": "fixed_window", "limit": 3, "window": "1h"}
RULE = {"limits": [FW]}

# (method, path, body) of every router endpoint that changes state other than counters.
WRITES: list[tuple[str, str, Any]] = [
    ("PUT", "/v1/rules/new-rule", RULE),
    ("DELETE", "/v1/rules/basic", None),
    ("POST", "/v1/cluster/nodes", {"id": "n9", "url": "http://127.0.0.1:9"}),
    ("DELETE", "/v1/cluster/nodes/n1", None),
    ("POST", "/v1/cluster/migration/resume", {}),
]


async def _call(
    cluster: Cluster, method: str, path: str, body: Any, token: str | None
) -> tuple[int, str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with cluster.http.request(
        method, cluster.router_url + path, json=body, headers=headers
    ) as resp:
        return resp.status, resp.content_type, await resp.json(content_type=None)


@pytest.mark.parametrize(("method", "path", "body"), WRITES, ids=[f"{m} {p}" for m, p, _ in WRITES])
async def test_every_write_needs_the_admin_token(
    cluster: Cluster, method: str, path: str, body: Any
) -> None:
    _, before_rules = await cluster.get("/v1/rules")
    _, before_cluster = await cluster.get("/v1/cluster")
    # No token, a wrong token, the cluster token (a node credential is not an admin one).
    missing = "this endpoint needs the admin token: Authorization: Bearer <token>"
    wrong = "the admin token given is not this cluster's"
    for token, detail in (
        (None, missing),
        ("wrong", wrong),
        (CLUSTER, wrong),
        (ADMIN + "x", wrong),
        ("", missing),
    ):
        status, content_type, problem = await _call(cluster, method, path, body, token)
        assert status == 401, (token, status, problem)
        assert content_type == "application/problem+json"
        assert problem["status"] == 401
        assert problem["detail"] == detail, token
    _, after_rules = await cluster.get("/v1/rules")
    _, after_cluster = await cluster.get("/v1/cluster")
    assert after_rules == before_rules
    assert after_cluster["epoch"] == before_cluster["epoch"]
    assert [n["id"] for n in after_cluster["nodes"]] == ["n1", "n2", "n3"]


HOSTILE_KEYS = [
    "]] redis.call('FLUSHALL') --[[",
    "'); redis.call('FLUSHALL'); --",
    "line\nbreak\r\n*3\r\n$8\r\nFLUSHALL",
    "glob*?[a-z]\\",
    "pipe|in|key",
    "{tag}|{other}",
    "c12345678|looks-like-a-counter",
    "r|scope|rid|nested",
    "\u0000nul and ünïcödé",
    "%s%d%n",
]


async def test_hostile_keys_are_only_data(cluster: Cluster) -> None:
    status, _ = await cluster.check({"key": "bystander", "limits": [FW]})
    assert status == 200
    for key in HOSTILE_KEYS:
        answers = [(await cluster.check({"key": key, "limits": [FW]}))[0] for _ in range(4)]
        assert answers == [200, 200, 200, 429], key
    # Nothing ran as code: the bystander's counter is intact, and each hostile key
    # has exactly its own counter.
    _, again = await cluster.check({"key": "bystander", "limits": [FW], "cost": 0})
    assert again["limits"][0]["remaining"] == 2
    total = 0
    for server in cluster.redis:
        client = redis.Redis(port=server.port)
        total += sum(1 for _ in client.scan_iter(match="c*", count=1000))
        client.close()
    assert total == len(HOSTILE_KEYS) + 1


async def test_limits_per_rule_are_capped(cluster: Cluster) -> None:
    many = [
        {"algorithm": "fixed_window", "limit": 10, "window": f"{i + 1}m"}
        for i in range(MAX_LIMITS_PER_RULE + 1)
    ]
    status, problem = await cluster.check({"key": "k", "limits": many})
    assert status == 400
    assert [e["field"] for e in problem["errors"]] == ["limits"]
    status, _, problem = await _call(cluster, "PUT", "/v1/rules/wide", {"limits": many}, ADMIN)
    assert status == 400
    assert [e["field"] for e in problem["errors"]] == ["body.limits"]
    status, _ = await cluster.check({"key": "k", "limits": many[:MAX_LIMITS_PER_RULE]})
    assert status == 200


async def test_the_bearer_scheme_is_case_insensitive(cluster: Cluster) -> None:
    """RFC 9110, 11.1: a client that spells the scheme "bearer" is not refused for it."""
    body = {"limits": [{"algorithm": "fixed_window", "limit": 5, "window": "1m"}]}
    for scheme in ("bearer", "BEARER", "Bearer"):
        async with cluster.http.put(
            cluster.router_url + "/v1/rules/scheme-case",
            json=body,
            headers={"Authorization": f"{scheme} {ADMIN}"},
        ) as resp:
            assert resp.status in (200, 201), (scheme, await resp.text())
    async with cluster.http.put(
        cluster.router_url + "/v1/rules/scheme-case",
        json=body,
        headers={"Authorization": f"Basic {ADMIN}"},
    ) as resp:
        assert resp.status == 401
