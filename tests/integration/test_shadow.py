"""`shadow: true` on a rule: decided and counted as usual, a denial answered as allowed."""

from __future__ import annotations

import pytest

from tests.conftest import Cluster, cluster_with_rules

pytestmark = pytest.mark.timeout(60)

RULES = """
rules:
  trial:
    shadow: true
    limits:
      - {algorithm: fixed_window, limit: 2, window: 1h}
  trial_cached:
    shadow: true
    cache_denials: true
    limits:
      - {algorithm: fixed_window, limit: 1, window: 1h}
"""


cluster = cluster_with_rules(RULES)


def shadowed(cluster: Cluster, rule: str) -> int:
    return int(cluster.router.metrics.count("shardlimit_shadow_decisions_total", rule=rule))


async def test_a_shadow_rule_never_denies_but_counts_and_reports(cluster: Cluster) -> None:
    answers = [await cluster.check({"key": "k", "rule": "trial"}) for _ in range(4)]
    assert [status for status, _ in answers] == [200, 200, 200, 200]
    assert [body["allowed"] for _, body in answers] == [True] * 4
    assert ["shadow" in body for _, body in answers] == [False, False, True, True]
    _, would_deny = answers[2]
    assert would_deny["denied_by"] == [0] and would_deny["retry_after_ms"] is None
    assert would_deny["limits"][0]["remaining"] == 0
    assert shadowed(cluster, "trial") == 2
    metrics = cluster.router.metrics
    assert metrics.count("shardlimit_decisions_total", rule="trial", outcome="denied") == 2
    assert metrics.count("shardlimit_decisions_total", rule="trial", outcome="allowed") == 2
    # The counter holds what was admitted for real: the two under the limit.
    usage = await cluster.usage("k", "trial")
    assert usage["limits"][0]["remaining"] == 0


async def test_a_shadow_rule_in_a_batch_and_from_the_denial_cache(cluster: Cluster) -> None:
    first = [await cluster.check({"key": "b", "rule": "trial_cached"}) for _ in range(2)]
    assert [body.get("shadow", False) for _, body in first] == [False, True]
    status, batch = await cluster.post(
        "/v1/check/batch",
        {"checks": [{"key": "b", "rule": "trial_cached"} for _ in range(2)]},
    )
    assert status == 200
    bodies = batch["results"]
    assert [(b["allowed"], b["shadow"], b["cached"]) for b in bodies] == [(True, True, True)] * 2
    assert shadowed(cluster, "trial_cached") == 3
    hits = cluster.router.metrics.count("shardlimit_denial_cache_hits_total", rule="trial_cached")
    assert hits == 2


async def test_rules_read_back_with_their_shadow_flag(cluster: Cluster) -> None:
    status, rules = await cluster.get("/v1/rules")
    assert status == 200
    by_name = {rule["name"]: rule for rule in rules["rules"]}
    assert by_name["trial"]["shadow"] is True
    assert by_name["trial_cached"]["cache_denials"] is True
    assert "shadow" not in by_name.get("basic", {})
