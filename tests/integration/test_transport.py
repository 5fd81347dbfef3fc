"""The router's node transport against a real aiohttp server: framing, reuse, failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from cluster.local.redis_proc import free_port
from router.channel.control_client import HttpPool
from tests.conftest import _start


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[str]]]:
    seen: list[str] = []
    release = asyncio.Event()

    async def echo(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.path} {request.headers.get('Authorization')}")
        body = await request.read()
        return web.Response(body=b"echo:" + body, status=201)

    async def chunked(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for part in (b"one,", b"two,", b"three"):
            await response.write(part)
        await response.write_eof()
        return response

    async def closing(request: web.Request) -> web.Response:
        return web.Response(body=b"bye", headers={"Connection": "close"})

    async def slow(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(body=b"late")

    app = web.Application()
    app.router.add_post("/base/echo", echo)
    app.router.add_get("/base/chunked", chunked)
    app.router.add_get("/base/closing", closing)
    app.router.add_get("/base/slow", slow)
    runner, port = await _start(app)
    try:
        yield f"http://127.0.0.1:{port}/base", seen
    finally:
        release.set()
        await runner.cleanup()


async def test_requests_reuse_one_connection_and_carry_headers(
    server: tuple[str, list[str]],
) -> None:
    url, seen = server
    pool = HttpPool(url, {"Authorization": "Bearer t"})
    for i in range(5):
        assert await pool.request("POST", "/echo", str(i).encode(), 2.0) == (
            201,
            f"echo:{i}".encode(),
        )
    assert len(pool._idle) == 1
    assert seen == ["POST /base/echo Bearer t"] * 5
    pool.close()


async def test_concurrent_requests_open_separate_connections(server: tuple[str, list[str]]) -> None:
    url, _ = server
    pool = HttpPool(url, {})
    answers = await asyncio.gather(*(pool.request("POST", "/echo", b"x", 2.0) for _ in range(8)))
    assert answers == [(201, b"echo:x")] * 8
    assert len(pool._idle) == 8
    pool.close()


async def test_chunked_and_connection_close_answers(server: tuple[str, list[str]]) -> None:
    url, _ = server
    pool = HttpPool(url, {})
    assert await pool.request("GET", "/chunked", None, 2.0) == (200, b"one,two,three")
    assert len(pool._idle) == 1
    assert await pool.request("GET", "/closing", None, 2.0) == (200, b"bye")
    assert pool._idle == []  # the connection it closed was not kept
    pool.close()


async def test_timeout_discards_the_connection(server: tuple[str, list[str]]) -> None:
    url, _ = server
    pool = HttpPool(url, {})
    with pytest.raises(TimeoutError):
        await pool.request("GET", "/slow", None, 0.05)
    assert pool._idle == []
    assert await pool.request("POST", "/echo", b"after", 2.0) == (201, b"echo:after")
    pool.close()


async def test_refused_connection_is_an_oserror() -> None:
    pool = HttpPool(f"http://127.0.0.1:{free_port()}", {})
    with pytest.raises(OSError):
        await pool.request("GET", "/x", None, 2.0)


def test_only_http_and_https_urls() -> None:
    with pytest.raises(ValueError, match="http://host:port or https://host:port"):
        HttpPool("ftp://example.org", {})
    assert HttpPool("https://example.org", {}).port == 443  # TLS: see tests/system/test_tls.py
