"""`limits`-style rate strings stand for fixed (or sliding) windows, inline and in rules."""

from __future__ import annotations

import pytest

from cluster.model.errors import Problems
from cluster.model.limits import parse_limits
from tests.conftest import Cluster

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10/second;1000/day", [("fixed_window", 10, "1s"), ("fixed_window", 1000, "1d")]),
        ("500/7 days", [("fixed_window", 500, "7d")]),
        ("3 per hour, 20/month", [("fixed_window", 3, "1h"), ("fixed_window", 20, "30d")]),
        ("sliding_window: 10 per minute", [("sliding_window", 10, "1m")]),
        ("2/Year", [("fixed_window", 2, "365d")]),
    ],
)
def test_rate_strings_expand(text: str, expected: list[tuple[str, int, str]]) -> None:
    problems = Problems()
    specs = parse_limits(text, "limits", problems)
    assert problems.errors == []
    got = [(d["algorithm"], d["limit"], d["window"]) for d in (s.to_dict() for s in specs)]
    assert got == expected


@pytest.mark.parametrize(
    ("value", "path", "message"),
    [
        ("10/fortnight", "limits[0]", "'10/fortnight' is not a rate"),
        (["5/hour", "ten/second"], "limits[1]", "'ten/second' is not a rate"),
        ("0/second", "limits[0].limit", "must be at least 1"),
        ("10/second;20/1 second", "limits[1]", "counts the same counter as limits[0]"),
        ("", "limits[0]", "'' is not a rate"),
    ],
)
def test_bad_rate_strings_are_named(value: object, path: str, message: str) -> None:
    problems = Problems()
    parse_limits(value, "limits", problems)  # callers refuse whatever has problems
    assert [(e.path, e.message[: len(message)]) for e in problems.errors][:1] == [(path, message)]


async def test_rate_strings_inline_and_in_rules(cluster: Cluster) -> None:
    statuses = [
        (await cluster.check({"key": "rs", "limits": "2/minute;5/hour"}))[0] for _ in range(3)
    ]
    assert statuses == [200, 200, 429]
    status, body = await cluster.check(
        {"key": "rs2", "limits": ["1/day", "sliding_window: 9/1 hour"]}
    )
    assert status == 200
    assert [(x["algorithm"], x["limit"]) for x in body["limits"]] == [
        ("fixed_window", 1),
        ("sliding_window", 9),
    ]
    headers = {"Authorization": "Bearer test-admin-token"}
    async with cluster.http.put(
        cluster.router_url + "/v1/rules/strings",
        json={"limits": "3/second;100/day"},
        headers=headers,
    ) as resp:
        assert resp.status == 201, await resp.text()
        rule = await resp.json()
    assert rule["limits"] == [
        {"algorithm": "fixed_window", "limit": 3, "window": "1s"},
        {"algorithm": "fixed_window", "limit": 100, "window": "1d"},
    ]
    status, problem = await cluster.check({"key": "rs3", "limits": "3 per fortnight"})
    assert status == 400 and problem["errors"][0]["field"] == "limits[0]"
