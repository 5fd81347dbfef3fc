"""The @limited decorator and the ASGI / aiohttp middlewares against a real cluster.

Starlette, FastAPI and aiohttp apps are real: the ASGI ones are served in-process through
`httpx.ASGITransport` (a handful of sequential requests), the aiohttp one on a real port.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import httpx
import pytest
from aiohttp import web
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from cluster.local.redis_proc import free_port
from cluster.sdk.aiohttp_middleware import rate_limit_middleware
from cluster.sdk.asgi import RateLimitMiddleware, Scope
from cluster.sdk.client import AsyncClient, Client
from cluster.sdk.decorator import RateLimited, limited
from cluster.sdk.http_guard import HttpGuard
from tests.conftest import Cluster

pytestmark = pytest.mark.timeout(60)

# The fixture pins every node's clock 10 minutes into an hour: a 1h fixed window has
# about 50 minutes (3000 s) left, a 1m one up to 60 s.
STATE = re.compile(r'^"basic\.0";r=(\d);t=(\d+)$')
BASIC_POLICY = '"basic.0";q=5;w=3600'
HEADERS = ("RateLimit", "RateLimit-Policy", "Retry-After")


def _user(scope: Scope) -> str:
    return "user:" + Request(scope).headers.get("x-user", "anon")


def _unreachable_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


def _starlette(calls: Counter[str]) -> Starlette:
    async def hello(request: Request) -> PlainTextResponse:
        calls["hello"] += 1
        return PlainTextResponse("hello")

    async def health(request: Request) -> PlainTextResponse:
        calls["health"] += 1
        return PlainTextResponse("ok")

    async def login(request: Request) -> PlainTextResponse:
        calls["login"] += 1
        return PlainTextResponse("in", headers={"X-App": "kept"})

    return Starlette(
        routes=[Route("/hello", hello), Route("/health", health), Route("/login", login)]
    )


async def _asgi_client(app: Starlette | FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app")


@pytest.fixture
async def sdk(cluster: Cluster) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(cluster.router_url) as client:
        yield client


def _assert_state(value: str | None, remaining: int) -> None:
    assert value is not None
    match = STATE.match(value)
    assert match is not None, value
    assert int(match.group(1)) == remaining
    assert 2900 <= int(match.group(2)) <= 3000


# --------------------------------------------------------------------------- ASGI


async def test_starlette_basic_limit_headers_and_429(cluster: Cluster, sdk: AsyncClient) -> None:
    calls: Counter[str] = Counter()
    app = _starlette(calls)
    app.add_middleware(RateLimitMiddleware, client=sdk, key=_user, default_rule="basic")
    async with await _asgi_client(app) as http:
        answers = [await http.get("/hello", headers={"x-user": "a"}) for _ in range(6)]
    assert [r.status_code for r in answers] == [200] * 5 + [429]
    assert calls["hello"] == 5
    for remaining, response in zip([4, 3, 2, 1, 0], answers, strict=False):
        assert response.text == "hello"
        assert response.headers["RateLimit-Policy"] == BASIC_POLICY
        _assert_state(response.headers["RateLimit"], remaining)
        assert "Retry-After" not in response.headers
    denied = answers[5]
    assert denied.headers["Content-Type"] == "application/problem+json"
    assert denied.headers["RateLimit-Policy"] == BASIC_POLICY
    _assert_state(denied.headers["RateLimit"], 0)
    body = denied.json()
    assert body["status"] == 429 and body["title"] == "Too Many Requests"
    retry_s = int(denied.headers["Retry-After"])
    assert retry_s == -(-body["retry_after_ms"] // 1000)  # rounded up
    assert 2900 <= retry_s <= 3000
    assert (await cluster.usage("user:a", "basic"))["limits"][0]["remaining"] == 0
    assert (await cluster.usage("user:anon", "basic"))["limits"][0]["remaining"] == 5


async def test_starlette_exempt_route_never_counted(cluster: Cluster, sdk: AsyncClient) -> None:
    calls: Counter[str] = Counter()
    app = _starlette(calls)
    app.add_middleware(
        RateLimitMiddleware, client=sdk, key=_user, default_rule="basic", exempt=["/health"]
    )
    async with await _asgi_client(app) as http:
        health = [await http.get("/health", headers={"x-user": "b"}) for _ in range(8)]
        hello = await http.get("/hello", headers={"x-user": "b"})
    assert [r.status_code for r in health] == [200] * 8
    assert calls["health"] == 8
    assert all("RateLimit" not in r.headers and "RateLimit-Policy" not in r.headers for r in health)
    assert hello.status_code == 200
    _assert_state(hello.headers["RateLimit"], 4)
    assert (await cluster.usage("user:b", "basic"))["limits"][0]["remaining"] == 4


async def test_starlette_per_route_rule_keeps_app_headers(
    cluster: Cluster, sdk: AsyncClient
) -> None:
    calls: Counter[str] = Counter()
    app = _starlette(calls)
    app.add_middleware(
        RateLimitMiddleware, client=sdk, key=_user, rules={"/login": "login"}, default_rule=None
    )
    async with await _asgi_client(app) as http:
        logins = [await http.get("/login", headers={"x-user": "c"}) for _ in range(4)]
        unlimited = [await http.get("/hello", headers={"x-user": "c"}) for _ in range(7)]
    assert [r.status_code for r in logins] == [200, 200, 200, 429]
    assert calls["login"] == 3
    assert logins[0].headers["X-App"] == "kept"
    assert logins[0].headers["RateLimit-Policy"] == '"login.0";q=3;w=3600'
    assert [r.headers["RateLimit"].split(";")[1] for r in logins] == ["r=2", "r=1", "r=0", "r=0"]
    assert 1 <= int(logins[3].headers["Retry-After"]) <= 3600
    # no default rule: other routes are not limited at all
    assert [r.status_code for r in unlimited] == [200] * 7 and calls["hello"] == 7
    assert all("RateLimit" not in r.headers for r in unlimited)
    assert (await cluster.usage("user:c", "basic"))["limits"][0]["remaining"] == 5


async def test_fastapi_route_pattern_rule(cluster: Cluster, sdk: AsyncClient) -> None:
    app = FastAPI()
    served: list[int] = []

    @app.get("/items/{item_id}")
    async def item(item_id: int) -> dict[str, int]:
        served.append(item_id)
        return {"item": item_id}

    @app.get("/ping")
    async def ping_route() -> dict[str, str]:
        return {"ping": "pong"}

    app.add_middleware(
        RateLimitMiddleware,
        client=sdk,
        key=_user,
        rules={"/items/{item_id}": "pair"},
        default_rule="basic",
    )
    async with await _asgi_client(app) as http:
        items = [await http.get(f"/items/{i}", headers={"x-user": "d"}) for i in range(1, 5)]
        pong = await http.get("/ping", headers={"x-user": "d"})
    assert [r.status_code for r in items] == [200, 200, 200, 429]
    assert served == [1, 2, 3]
    assert items[0].json() == {"item": 1}
    assert items[0].headers["RateLimit-Policy"] == '"pair.0";q=10;w=3600, "pair.1";q=3;w=60'
    assert re.fullmatch(r'"pair\.0";r=9;t=\d+, "pair\.1";r=2;t=\d+', items[0].headers["RateLimit"])
    denied = items[3]
    assert denied.json()["retry_after_ms"] <= 60_000
    assert 1 <= int(denied.headers["Retry-After"]) <= 60
    assert pong.status_code == 200 and pong.headers["RateLimit-Policy"] == BASIC_POLICY


async def test_asgi_unreachable_router_default_allows_and_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: Counter[str] = Counter()
    app = _starlette(calls)
    async with AsyncClient(_unreachable_url(), timeout=2.0) as sdk:
        app.add_middleware(RateLimitMiddleware, client=sdk, key=_user, default_rule="basic")
        with caplog.at_level(logging.WARNING, logger="shardlimit.integrations"):
            async with await _asgi_client(app) as http:
                answers = [await http.get("/hello") for _ in range(3)]
    assert [r.status_code for r in answers] == [200] * 3 and calls["hello"] == 3
    assert all("RateLimit" not in r.headers and "Retry-After" not in r.headers for r in answers)
    warnings = [r for r in caplog.records if r.name == "shardlimit.integrations"]
    assert len(warnings) == 3
    assert "allowing key 'user:anon' under rule 'basic'" in warnings[0].getMessage()
    assert "no on_failure given" in warnings[0].getMessage()


async def test_asgi_unreachable_router_deny_override() -> None:
    calls: Counter[str] = Counter()
    app = _starlette(calls)
    async with AsyncClient(_unreachable_url(), timeout=2.0) as sdk:
        app.add_middleware(
            RateLimitMiddleware, client=sdk, key=_user, default_rule="basic", on_failure="deny"
        )
        async with await _asgi_client(app) as http:
            denied = await http.get("/hello")
            exempt_free = await http.get("/health")
    assert denied.status_code == 429 and calls["hello"] == 0
    assert denied.headers["Retry-After"] == "1"
    assert "RateLimit" not in denied.headers
    assert denied.json()["retry_after_ms"] == 1000
    assert (
        denied.json()["detail"] == "the rate-limit service is unreachable and on_failure is 'deny'"
    )
    # /health has no rule here either (default applies): also denied, never reached
    assert exempt_free.status_code == 429 and calls["health"] == 0


# --------------------------------------------------------------------------- aiohttp


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def _aiohttp_app(
    calls: Counter[str], middleware: Callable[..., Awaitable[web.StreamResponse]]
) -> web.Application:
    async def hello(request: web.Request) -> web.Response:
        calls["hello"] += 1
        return web.Response(text="hello")

    async def health(request: web.Request) -> web.Response:
        calls["health"] += 1
        return web.Response(text="ok")

    async def item(request: web.Request) -> web.Response:
        calls["item"] += 1
        return web.json_response({"item": request.match_info["id"]})

    async def gone(request: web.Request) -> web.Response:
        calls["gone"] += 1
        raise web.HTTPNotFound()

    app = web.Application(middlewares=[middleware])
    app.router.add_get("/hello", hello, name="hello")
    app.router.add_get("/health", health)
    app.router.add_get("/items/{id}", item)
    app.router.add_get("/gone", gone)
    return app


def _remote_key(request: web.Request) -> str:
    return "aio:" + request.headers.get("X-User", "anon")


async def test_aiohttp_route_name_pattern_exempt(cluster: Cluster, sdk: AsyncClient) -> None:
    calls: Counter[str] = Counter()
    middleware = rate_limit_middleware(
        client=sdk,
        key=_remote_key,
        rules={"hello": "basic", "/items/{id}": "login"},
        exempt=["/health"],
        default_rule="basic",
    )
    runner, url = await _serve(_aiohttp_app(calls, middleware))
    try:
        async with aiohttp.ClientSession(headers={"X-User": "e"}) as http:
            hello = []
            for _ in range(6):
                async with http.get(url + "/hello") as resp:
                    hello.append((resp.status, dict(resp.headers), await resp.text()))
            health = []
            for _ in range(6):
                async with http.get(url + "/health") as resp:
                    health.append((resp.status, "RateLimit" in resp.headers))
            items = []
            for i in range(4):
                async with http.get(f"{url}/items/{i}") as resp:
                    items.append((resp.status, resp.headers.get("RateLimit-Policy")))
    finally:
        await runner.cleanup()
    assert [s for s, _, _ in hello] == [200] * 5 + [429]
    assert calls["hello"] == 5
    for remaining, (_, headers, text) in zip([4, 3, 2, 1, 0], hello, strict=False):
        assert text == "hello" and headers["RateLimit-Policy"] == BASIC_POLICY
        _assert_state(headers["RateLimit"], remaining)
    _, denied_headers, denied_text = hello[5]
    assert denied_headers["Content-Type"] == "application/problem+json"
    assert '"status":429' in denied_text
    assert 2900 <= int(denied_headers["Retry-After"]) <= 3000
    assert health == [(200, False)] * 6 and calls["health"] == 6
    assert items == [(200, '"login.0";q=3;w=3600')] * 3 + [(429, '"login.0";q=3;w=3600')]
    assert calls["item"] == 3
    assert (await cluster.usage("aio:e", "basic"))["limits"][0]["remaining"] == 0
    assert (await cluster.usage("aio:e", "login"))["limits"][0]["remaining"] == 0


async def test_aiohttp_http_exception_gets_headers(cluster: Cluster, sdk: AsyncClient) -> None:
    calls: Counter[str] = Counter()
    middleware = rate_limit_middleware(client=sdk, key=_remote_key, default_rule="basic")
    runner, url = await _serve(_aiohttp_app(calls, middleware))
    try:
        async with aiohttp.ClientSession() as http, http.get(url + "/gone") as resp:
            status, headers = resp.status, dict(resp.headers)
    finally:
        await runner.cleanup()
    assert status == 404 and calls["gone"] == 1
    assert headers["RateLimit-Policy"] == BASIC_POLICY
    _assert_state(headers["RateLimit"], 4)


async def test_aiohttp_unreachable_router_override(caplog: pytest.LogCaptureFixture) -> None:
    calls: Counter[str] = Counter()
    async with AsyncClient(_unreachable_url(), timeout=2.0) as sdk:
        deny = rate_limit_middleware(
            client=sdk, key=_remote_key, default_rule="basic", on_failure="deny"
        )
        allow = rate_limit_middleware(
            client=sdk, key=_remote_key, default_rule="basic", on_failure="allow"
        )
        results = []
        for middleware in (deny, allow):
            runner, url = await _serve(_aiohttp_app(calls, middleware))
            try:
                with caplog.at_level(logging.WARNING, logger="shardlimit.integrations"):
                    async with aiohttp.ClientSession() as http, http.get(url + "/hello") as resp:
                        results.append((resp.status, resp.headers.get("Retry-After")))
            finally:
                await runner.cleanup()
    assert results == [(429, "1"), (200, None)]
    assert calls["hello"] == 1
    messages = [r.getMessage() for r in caplog.records if r.name == "shardlimit.integrations"]
    assert len(messages) == 2
    assert "denying" in messages[0] and "on_failure override" in messages[0]
    assert "allowing" in messages[1] and "on_failure override" in messages[1]


# --------------------------------------------------------------------------- decorator


async def test_decorator_async_function(cluster: Cluster, sdk: AsyncClient) -> None:
    ran: list[str] = []

    @limited(rule="basic", key=lambda user, **_: f"dec:{user}", client=sdk)
    async def work(user: str, *, tag: str = "") -> str:
        ran.append(tag)
        return f"done {user}{tag}"

    results = [await work("f", tag=str(i)) for i in range(5)]
    assert results == [f"done f{i}" for i in range(5)]
    with pytest.raises(RateLimited) as denied:
        await work("f", tag="x")
    assert ran == ["0", "1", "2", "3", "4"]
    exc = denied.value
    assert exc.allowed is False and exc.key == "dec:f" and exc.rule == "basic"
    assert exc.retry_after_ms is not None and 2_900_000 <= exc.retry_after_ms <= 3_000_000
    assert len(exc.limits) == 1 and exc.limits[0].limit == 5 and exc.limits[0].remaining == 0
    assert exc.decision.denied_by == (0,) and not exc.decision.degraded
    assert work.__name__ == "work"


async def test_decorator_callable_cost(cluster: Cluster, sdk: AsyncClient) -> None:
    ran: list[int] = []

    @limited(rule="basic", key=lambda user, n: f"cost:{user}", cost=lambda user, n: n, client=sdk)
    async def take(user: str, n: int) -> int:
        ran.append(n)
        return n

    assert await take("g", 2) == 2
    assert await take("g", 2) == 2
    with pytest.raises(RateLimited) as denied:
        await take("g", 2)
    assert ran == [2, 2]
    assert denied.value.limits[0].remaining == 1
    assert await take("g", 1) == 1
    assert (await cluster.usage("cost:g", "basic"))["limits"][0]["remaining"] == 0


def _sync_calls(url: str, user: str, calls: int) -> tuple[list[str], list[str], RateLimited | None]:
    ran: list[str] = []
    results: list[str] = []
    denied: RateLimited | None = None
    with Client(url) as client:

        @limited(rule="basic", key=lambda user: f"sync:{user}", client=client)
        def work(user: str) -> str:
            ran.append(user)
            return user.upper()

        for _ in range(calls):
            try:
                results.append(work(user))
            except RateLimited as exc:
                denied = exc
    return ran, results, denied


async def test_decorator_sync_function_in_thread(cluster: Cluster) -> None:
    ran, results, denied = await asyncio.to_thread(_sync_calls, cluster.router_url, "h", 6)
    assert ran == ["h"] * 5 and results == ["H"] * 5
    assert denied is not None and denied.key == "sync:h" and denied.rule == "basic"
    assert denied.retry_after_ms is not None and denied.limits[0].remaining == 0
    assert (await cluster.usage("sync:h", "basic"))["limits"][0]["remaining"] == 0


def test_decorator_sync_unreachable_router(caplog: pytest.LogCaptureFixture) -> None:
    url = _unreachable_url()
    with caplog.at_level(logging.WARNING, logger="shardlimit.integrations"):
        ran, results, denied = _sync_calls(url, "i", 2)
    assert ran == ["i", "i"] and results == ["I", "I"] and denied is None
    messages = [r.getMessage() for r in caplog.records if r.name == "shardlimit.integrations"]
    assert len(messages) == 2 and "cannot reach the router" in messages[0]
    assert "allowing key 'sync:i' under rule 'basic'" in messages[0]

    with Client(url, timeout=2.0) as client:

        @limited(rule="basic", key=lambda: "sync:j", client=client, on_failure="deny")
        def never() -> None:
            raise AssertionError("must not run")

        with pytest.raises(RateLimited) as exc:
            never()
    decision = exc.value.decision
    assert decision.degraded and decision.degraded_reason == "unreachable"
    assert decision.retry_after_ms == 1000 and decision.allowed is False
    assert decision.key == "sync:j" and decision.rule == "basic" and decision.limits == ()


async def test_decorator_async_unreachable_router_override() -> None:
    ran: list[int] = []
    async with AsyncClient(_unreachable_url(), timeout=2.0) as client:

        @limited(rule="basic", key=lambda n: "k", client=client, on_failure="deny")
        async def denied(n: int) -> None:
            ran.append(n)

        @limited(rule="basic", key=lambda n: "k", client=client, on_failure="allow")
        async def allowed(n: int) -> None:
            ran.append(n)

        with pytest.raises(RateLimited) as exc:
            await denied(1)
        await allowed(2)
    assert ran == [2]
    assert exc.value.decision.degraded and exc.value.retry_after_ms == 1000


def test_decorator_checks_client_kind_and_on_failure() -> None:
    sync_client = Client(_unreachable_url())
    async_client = AsyncClient(_unreachable_url())

    async def coro() -> None:
        return None

    def plain() -> None:
        return None

    with pytest.raises(TypeError, match="needs an AsyncClient"):
        limited(rule="basic", key=lambda: "k", client=sync_client)(coro)
    with pytest.raises(TypeError, match="needs a \\(sync\\) Client"):
        limited(rule="basic", key=lambda: "k", client=async_client)(plain)
    with pytest.raises(ValueError, match="on_failure must be"):
        limited(rule="basic", key=lambda: "k", client=sync_client, on_failure="open")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- same headers


@pytest.mark.parametrize("rule", ["basic", "pair", "login", "payments"])
async def test_headers_equal_the_routers(cluster: Cluster, sdk: AsyncClient, rule: str) -> None:
    guard = HttpGuard(sdk)
    ours: list[dict[str, str]] = []
    theirs: list[dict[str, str]] = []
    for _ in range(6):
        ours.append((await guard.check(f"ours:{rule}", rule)).headers)
        async with cluster.http.post(
            cluster.router_url + "/v1/check", json={"key": f"theirs:{rule}", "rule": rule}
        ) as resp:
            theirs.append({k: resp.headers[k] for k in HEADERS if k in resp.headers})

    def coarse(headers: dict[str, str]) -> dict[str, str]:
        # t= and Retry-After can differ by a second between the two calls
        return {k: re.sub(r";t=\d+", ";t=?", v) for k, v in headers.items() if k != "Retry-After"}

    assert [coarse(h) for h in ours] == [coarse(h) for h in theirs]
    assert [sorted(h) for h in ours] == [sorted(h) for h in theirs]
    for mine, router in zip(ours, theirs, strict=True):
        if "Retry-After" in router:
            assert abs(int(mine["Retry-After"]) - int(router["Retry-After"])) <= 1
    if rule == "payments":  # amount-only calendar limits: no request quota, no headers
        assert ours == [{}] * 6
    else:
        assert "RateLimit-Policy" in ours[0]
