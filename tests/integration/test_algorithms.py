"""Each algorithm at its boundaries, through the router, with the node clock moved in tests."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis.asyncio as aioredis

from tests.conftest import Cluster

H = 3_600_000
M = 60_000
S = 1000
SPREAD_MAX = 60 * S  # the longest a counter outlives its window (node/store/lua/common.lua)
# An hour boundary well away from "now": 2027-03-01T10:00:00Z.
T = int(datetime(2027, 3, 1, 10, tzinfo=ZoneInfo("UTC")).timestamp() * 1000)


def body(key: str, limit: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"key": key, "limits": [limit], **extra}


async def hits(cluster: Cluster, payload: dict[str, Any], n: int) -> list[dict[str, Any]]:
    out = []
    for _ in range(n):
        status, data = await cluster.check(payload)
        assert status == (200 if data["allowed"] else 429)
        out.append(data)
    return out


def near(value: int | None, expected: int, tolerance: int = 5 * S) -> bool:
    """Real time passes between moving the clock and checking: allow a few seconds."""
    return value is not None and abs(value - expected) <= tolerance


def allowed(results: list[dict[str, Any]]) -> int:
    return sum(1 for r in results if r["allowed"])


async def test_fixed_window_exact_limit_and_rollover(cluster: Cluster) -> None:
    limit = {"algorithm": "fixed_window", "limit": 5, "window": "1h"}
    payload = body("fw:1", limit)
    await cluster.set_time(T - 10 * S)
    results = await hits(cluster, payload, 7)
    assert [r["allowed"] for r in results] == [True] * 5 + [False] * 2
    assert [r["limits"][0]["remaining"] for r in results[:5]] == [4, 3, 2, 1, 0]
    denied = results[5]
    assert denied["denied_by"] == [0]
    # Retry when the window ends, 10 s away (minus the time the calls took).
    assert near(denied["retry_after_ms"], 10 * S)
    await cluster.set_time(T + 10 * S)
    after = await hits(cluster, payload, 6)
    assert allowed(after) == 5
    assert after[0]["limits"][0]["remaining"] == 4
    assert near(after[0]["limits"][0]["reset_after_ms"], H - 10 * S)


async def test_an_unused_fixed_window_resets_when_its_window_ends(cluster: Cluster) -> None:
    """A read (cost 0, GET /v1/usage, dry_run) of a counter never used still answers the
    time to the window's end, as the docs say: not 0."""
    limit = {"algorithm": "fixed_window", "limit": 5, "window": "1h"}
    await cluster.set_time(T - 10 * S)  # this window ends 10 s from now
    _, read = await cluster.check(body("fw:unused", limit, cost=0))
    _, dry = await cluster.check(body("fw:unused", limit, dry_run=True))
    for answer, remaining in ((read, 5), (dry, 4)):  # the dry run of one: what it would leave
        assert answer["allowed"] is True and answer["limits"][0]["remaining"] == remaining
        assert near(answer["limits"][0]["reset_after_ms"], 10 * S, tolerance=3 * S), answer
    status, usage = await cluster.get("/v1/usage?key=fw:unused&rule=basic")
    assert status == 200 and usage["limits"][0]["remaining"] == usage["limits"][0]["limit"]
    assert near(usage["limits"][0]["reset_after_ms"], 10 * S, tolerance=3 * S), usage


async def test_fixed_window_over_limit_cost_is_never_admitted(cluster: Cluster) -> None:
    payload = body("fw:big", {"algorithm": "fixed_window", "limit": 5, "window": "1h"}, cost=6)
    status, data = await cluster.check(payload)
    assert status == 429 and data["allowed"] is False
    assert data["retry_after_ms"] is None
    status, data = await cluster.check(body("fw:big", payload["limits"][0], cost=5))
    assert status == 200 and data["limits"][0]["remaining"] == 0


async def test_fixed_window_adds_in_place_and_still_ends_with_its_window(
    cluster: Cluster,
) -> None:
    """After the first hit a window's count is added to in place: the stored count is
    exact and the key still expires when the window ends (within its spread), not a
    window after a hit."""
    limit = {"algorithm": "fixed_window", "limit": 50, "window": "1h"}
    await cluster.set_time(T - 10 * S)  # this window ends 10 s from now
    results = await hits(cluster, body("fw:inplace", limit, cost=2), 3)
    assert [r["limits"][0]["remaining"] for r in results] == [48, 46, 44]
    client = aioredis.Redis(port=cluster.owner_redis("fw:inplace").port)
    try:
        names = [name async for name in client.scan_iter(match="c*|fw:inplace")]
        assert len(names) == 1
        assert await client.get(names[0]) == b"6"
        ttl = await client.pttl(names[0])
    finally:
        await client.aclose()
    assert 5 * S < ttl <= 10 * S + SPREAD_MAX


@pytest.mark.parametrize(
    ("limit", "base"),
    [
        ({"algorithm": "fixed_window", "limit": 5, "window": "1h"}, 10 * S),
        # Its count weighs on the next window, so it lives until that one ends.
        ({"algorithm": "sliding_window", "limit": 5, "window": "1h"}, H + 10 * S),
        (
            {"algorithm": "calendar", "period": "day", "timezone": "UTC", "max_count": 5},
            14 * H + 10 * S,
        ),
    ],
    ids=["fixed_window", "sliding_window", "calendar"],
)
async def test_counters_of_one_window_do_not_all_expire_at_once(
    cluster: Cluster, limit: dict[str, Any], base: int
) -> None:
    """Counters written in one aligned window outlive it by up to a minute each, picked
    by Redis' clock: all expiring at its end together, they would hold Redis up while
    its active expiry deleted them."""
    await cluster.set_time(T - 10 * S)  # the hour, and this window, end 10 s from now
    keys = [f"spread:{limit['algorithm']}:{i}" for i in range(100)]
    for key in keys:
        status, _ = await cluster.check(body(key, limit))
        assert status == 200
    ttls = []
    for key in keys:
        client = aioredis.Redis(port=cluster.owner_redis(key).port)
        try:
            [name] = [name async for name in client.scan_iter(match=f"c*|{key}")]
            ttls.append(await client.pttl(name))
        finally:
            await client.aclose()
    assert all(base - 5 * S < ttl <= base + SPREAD_MAX for ttl in ttls), (min(ttls), max(ttls))
    assert max(ttls) - min(ttls) > 2 * S  # a hundred checks take more than 2 ms


async def test_a_fixed_window_count_that_outlives_its_window_is_not_counted(
    cluster: Cluster,
) -> None:
    """A count whose key lives on after its window by the longest spread is still its
    own window's count until the window ends, and none of the next window's."""
    limit = {"algorithm": "fixed_window", "limit": 5, "window": "1h"}
    payload = body("fw:outlives", limit)
    await cluster.set_time(T - 10 * S)
    assert allowed(await hits(cluster, payload, 5)) == 5
    client = aioredis.Redis(port=cluster.owner_redis("fw:outlives").port)
    try:
        [name] = [name async for name in client.scan_iter(match="c*|fw:outlives")]
        await client.pexpire(name, 10 * S + SPREAD_MAX - 1)
    finally:
        await client.aclose()
    assert allowed(await hits(cluster, payload, 1)) == 0
    await cluster.set_time(T + 1 * S)
    results = await hits(cluster, payload, 6)
    assert allowed(results) == 5
    assert results[0]["limits"][0]["remaining"] == 4


async def test_sliding_log_is_exact_over_the_window(cluster: Cluster) -> None:
    limit = {"algorithm": "sliding_log", "limit": 3, "window": "1h"}
    payload = body("log:1", limit)
    await cluster.set_time(T)
    assert allowed(await hits(cluster, payload, 1)) == 1
    await cluster.set_time(T + 20 * M)
    assert allowed(await hits(cluster, payload, 2)) == 2
    await cluster.set_time(T + 40 * M)
    denied = (await hits(cluster, payload, 1))[0]
    assert denied["allowed"] is False
    # The first hit leaves the window at T + 60 min: 20 minutes from now.
    assert near(denied["retry_after_ms"], 20 * M)
    await cluster.set_time(T + 60 * M + 5 * S)
    results = await hits(cluster, payload, 2)
    assert [r["allowed"] for r in results] == [True, False]
    # A fixed window would have reset at T+60min; the log still holds the two 20-min hits.
    await cluster.set_time(T + 80 * M + 5 * S)
    results = await hits(cluster, payload, 3)
    assert [r["allowed"] for r in results] == [True, True, False]


async def test_sliding_window_weighs_the_previous_window(cluster: Cluster) -> None:
    limit = {"algorithm": "sliding_window", "limit": 10, "window": "1h"}
    payload = body("sw:1", limit)
    await cluster.set_time(T + 30 * M)
    assert allowed(await hits(cluster, payload, 12)) == 10
    # 15 minutes into the next window the previous 10 weigh 10 * 0.75 = 7.5:
    # 7.5 + 1 + 1 = 9.5 fits, a third would make 10.5.
    await cluster.set_time(T + H + 15 * M)
    results = await hits(cluster, payload, 3)
    assert [r["allowed"] for r in results] == [True, True, False]
    assert results[1]["limits"][0]["remaining"] == 0
    # Two windows later nothing is left of either.
    await cluster.set_time(T + 3 * H + 1 * S)
    assert allowed(await hits(cluster, payload, 11)) == 10


async def test_token_bucket_starts_full_and_refills_continuously(cluster: Cluster) -> None:
    limit = {"algorithm": "token_bucket", "rate": 1, "period": "10m", "burst": 3}
    payload = body("tb:1", limit)
    await cluster.set_time(T)
    results = await hits(cluster, payload, 4)
    assert [r["allowed"] for r in results] == [True, True, True, False]
    assert [r["limits"][0]["remaining"] for r in results[:3]] == [2, 1, 0]
    assert near(results[3]["retry_after_ms"], 10 * M)
    await cluster.set_time(T + 5 * M)  # half a token
    assert allowed(await hits(cluster, payload, 1)) == 0
    await cluster.set_time(T + 10 * M + 1 * S)  # one token
    assert [r["allowed"] for r in await hits(cluster, payload, 2)] == [True, False]
    await cluster.set_time(T + 5 * H)  # capped at the burst
    assert allowed(await hits(cluster, payload, 5)) == 3


async def test_leaky_bucket_shapes_with_delays_then_denies(cluster: Cluster) -> None:
    limit = {"algorithm": "leaky_bucket", "rate": 1, "period": "1m", "capacity": 3}
    payload = body("lb:1", limit)
    await cluster.set_time(T)
    results = await hits(cluster, payload, 4)
    assert [r["allowed"] for r in results] == [True, True, True, False]
    delays = [r["limits"][0]["delay_ms"] for r in results[:3]]
    assert delays[0] == 0
    assert near(delays[1], M)
    assert near(delays[2], 2 * M)
    # Queue full: retry when one unit has drained.
    assert 0 < results[3]["retry_after_ms"] <= M
    await cluster.set_time(T + M + 1 * S)
    results = await hits(cluster, payload, 2)
    assert [r["allowed"] for r in results] == [True, False]
    assert near(results[0]["limits"][0]["delay_ms"], 2 * M)


def local_ms(tz: str, *parts: int, fold: int = 0) -> int:
    naive = datetime(*parts)  # type: ignore[arg-type]
    return int(naive.replace(tzinfo=ZoneInfo(tz), fold=fold).timestamp() * 1000)


CALENDAR_BOUNDARIES = [
    # (period, timezone, boundary instant) - each a natural boundary in that zone
    ("day", "Europe/Paris", local_ms("Europe/Paris", 2026, 10, 26)),  # after a 25 h day
    ("day", "Europe/Paris", local_ms("Europe/Paris", 2027, 3, 29)),  # after a 23 h day
    ("hour", "Europe/Paris", local_ms("Europe/Paris", 2026, 10, 25, 2, fold=1)),  # repeated hour
    ("hour", "Asia/Kolkata", local_ms("Asia/Kolkata", 2027, 1, 5, 9)),  # :30 UTC
    ("week", "Europe/Berlin", local_ms("Europe/Berlin", 2026, 12, 28)),  # ISO 2026-W53
    ("month", "America/New_York", local_ms("America/New_York", 2027, 3, 1)),
    ("month", "America/New_York", local_ms("America/New_York", 2028, 3, 1)),  # leap February
    ("year", "Asia/Tokyo", local_ms("Asia/Tokyo", 2027, 1, 1)),
    ("minute", "Australia/Lord_Howe", local_ms("Australia/Lord_Howe", 2027, 2, 3, 4, 5)),
]


@pytest.mark.parametrize(("period", "tz", "boundary"), CALENDAR_BOUNDARIES)
async def test_calendar_counts_reset_exactly_at_natural_boundaries(
    cluster: Cluster, period: str, tz: str, boundary: int
) -> None:
    limit = {"algorithm": "calendar", "period": period, "timezone": tz, "max_count": 2}
    payload = body(f"cal:{period}:{tz}:{boundary}", limit)
    await cluster.set_time(boundary - 20 * S)
    results = await hits(cluster, payload, 3)
    assert [r["allowed"] for r in results] == [True, True, False]
    assert near(results[2]["retry_after_ms"], 20 * S)
    await cluster.set_time(boundary + 1 * S)
    results = await hits(cluster, payload, 3)
    assert [r["allowed"] for r in results] == [True, True, False]


async def test_calendar_repeated_dst_hour_is_two_periods(cluster: Cluster) -> None:
    limit = {"algorithm": "calendar", "period": "hour", "timezone": "Europe/Paris", "max_count": 1}
    payload = body("cal:fold", limit)
    first = local_ms("Europe/Paris", 2026, 10, 25, 2, 30, fold=0)  # 02:30 CEST
    second = local_ms("Europe/Paris", 2026, 10, 25, 2, 30, fold=1)  # 02:30 CET, 1 h later
    assert second - first == H
    await cluster.set_time(first)
    assert [r["allowed"] for r in await hits(cluster, payload, 2)] == [True, False]
    await cluster.set_time(second)
    assert [r["allowed"] for r in await hits(cluster, payload, 2)] == [True, False]


async def test_calendar_counts_and_amounts_together(cluster: Cluster) -> None:
    limit = {
        "algorithm": "calendar",
        "period": "month",
        "timezone": "Europe/Paris",
        "max_count": 3,
        "max_amount": "100.00",
    }
    month_end = local_ms("Europe/Paris", 2027, 2, 1)
    await cluster.set_time(month_end - 30 * S)
    status, data = await cluster.check(body("cal:both", limit, amount="99.99"))
    assert status == 200
    assert data["limits"][0]["amount_remaining"] == "0.01"
    assert data["limits"][0]["remaining"] == 2
    status, data = await cluster.check(body("cal:both", limit, amount=0.02))
    assert status == 429 and data["limits"][0]["amount_remaining"] == "0.01"
    status, data = await cluster.check(body("cal:both", limit, amount="0.01"))
    assert status == 200 and data["limits"][0]["amount_remaining"] == "0.00"
    status, data = await cluster.check(body("cal:both", limit, amount=0))
    assert status == 200 and data["limits"][0]["remaining"] == 0
    status, data = await cluster.check(body("cal:both", limit, amount=0))
    assert status == 429  # the count is exhausted even though the amount is 0
    await cluster.set_time(month_end + 1 * S)
    status, data = await cluster.check(body("cal:both", limit, amount="100.00"))
    assert status == 200 and data["limits"][0]["amount_remaining"] == "0.00"
