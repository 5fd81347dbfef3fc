"""`shardlimit status`'s Redis cell and the line under its table, word for word."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.cli.status import redis_cell, unreplicated_line

pytestmark = pytest.mark.timeout(10)

LONE = {"replicated": False, "primary": "127.0.0.1:7201"}


def _replicated(up: list[bool], failovers: int) -> dict[str, Any]:
    replicas = [{"addr": f"127.0.0.1:{7300 + i}", "up": live} for i, live in enumerate(up)]
    return {
        "replicated": True,
        "primary": "127.0.0.1:7201",
        "replicas": replicas,
        "failovers": failovers,
    }


@pytest.mark.parametrize(
    ("redis", "cell"),
    [
        (None, "-"),
        (LONE, "127.0.0.1:7201, no replicas"),
        (_replicated([True, False], 0), "127.0.0.1:7201 + 1/2 replicas up"),
        (_replicated([True], 1), "127.0.0.1:7201 + 1/1 replicas up, 1 failover followed"),
        (_replicated([True], 2), "127.0.0.1:7201 + 1/1 replicas up, 2 failovers followed"),
        (
            _replicated([False], 0),
            "127.0.0.1:7201 + 0/1 replicas up (NO LIVE REPLICA: replica rules answer degraded)",
        ),
    ],
    ids=["unknown", "lone", "one-of-two-up", "one-failover", "two-failovers", "none-live"],
)
def test_the_redis_cell(redis: dict[str, Any] | None, cell: str) -> None:
    assert redis_cell(redis) == cell


def test_what_no_replicas_means_is_said_once_for_the_shards_without() -> None:
    nodes: list[dict[str, Any]] = [
        {"id": "n1", "redis": LONE},
        {"id": "n2", "redis": _replicated([True], 0)},
        {"id": "n3", "redis": LONE},
        {"id": "n4", "redis": None},  # down: the router could not tell
    ]
    assert unreplicated_line(nodes) == (
        "no replicas on n1, n3: `durability: replica` rules are served as `primary` there"
    )
    assert unreplicated_line(nodes[1:2]) is None
