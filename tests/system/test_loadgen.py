"""cluster.local.loadgen counts every answer exactly, from its own process, and survives errors."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from cluster.local.loadgen import run_loadgen
from cluster.local.redis_proc import free_port

LONG_REASON = "node n1 did not answer within 50 ms; " * 5  # longer than the 80 kept
KEYS, LIMIT = 50, 3


def _answer(key: int, seen: int) -> web.Response:
    """Deterministic per key: 48 fails, every tenth is degraded, else the first 3 pass."""
    if key == 48:
        return web.Response(status=500, text="boom")
    body: dict[str, object] = {"key": f"k{key}", "degraded": False}
    if key % 10 == 9:
        body.update(allowed=True, degraded=True, degraded_reason=LONG_REASON)
        return web.json_response(body)
    allowed = seen <= LIMIT
    body["allowed"] = allowed
    response = web.json_response(body, status=200 if allowed else 429)
    if key == 47:
        response.force_close()  # the generator must reopen the connection and go on
    return response


@pytest.fixture
async def fake_router() -> AsyncIterator[str]:
    seen: Counter[int] = Counter()

    async def check(request: web.Request) -> web.Response:
        if request.headers.get("X-Test") != "yes":
            return web.json_response({"error": "header missing"}, status=400)
        key = int((await request.json())["n"])
        seen[key] += 1
        return _answer(key, seen[key])

    app = web.Application()
    app.router.add_post("/v1/check", check)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/v1/check"
    finally:
        await runner.cleanup()


@pytest.mark.timeout(60)
async def test_counts_are_exact(fake_router: str) -> None:
    result = await run_loadgen(
        fake_router,
        connections=64,
        requests=1000,
        keys=KEYS,
        per_key=True,
        body='{"key":"k{i}","n":{i}}',
        headers={"X-Test": "yes"},
    )
    assert result["requests"] == result["answered"] == 1000
    assert result["connections"] == 64
    assert result["status"] == {"200": 232, "429": 748, "500": 20}
    normal = [k for k in range(KEYS) if k != 48 and k % 10 != 9]  # 44 keys, 20 requests each
    assert result["allowed"] == LIMIT * len(normal) + 100
    assert result["denied"] == (20 - LIMIT) * len(normal)
    assert result["degraded"] == result["degraded_allowed"] == 100
    assert result["degraded_reasons"] == {LONG_REASON[:80]: 100}
    assert result["errors"] == 20 and len(result["error_samples"]) == 10
    assert result["allowed_by_key"] == {f"k{k}": LIMIT for k in normal}
    assert 0 < result["latency_ms"]["p50"] <= result["latency_ms"]["max"]


@pytest.mark.timeout(60)
async def test_duration_mode_answers_everything_it_sent(fake_router: str) -> None:
    result = await run_loadgen(
        fake_router,
        connections=8,
        duration_s=0.5,
        body='{"key":"k0","n":0}',
        headers={"X-Test": "yes"},
    )
    assert result["requests"] == result["answered"] > 0
    assert result["status"]["429"] == result["answered"] - LIMIT


@pytest.mark.timeout(60)
async def test_connection_errors_are_counted_not_fatal() -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1/check"
    result = await run_loadgen(dead, connections=4, requests=12, body="{}", timeout_s=2.0)
    assert result["requests"] == result["errors"] == 12
    assert result["answered"] == 0 and result["status"] == {}
    assert "connect" in result["error_samples"][0]
