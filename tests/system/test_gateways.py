"""Forward auth through real gateways: Debian's nginx, Caddy and HAProxy, each in front
of a tiny upstream, asking a real cluster (`GET /v1/authz`) before every request.

The example configs under compose/gateways/ are the ones tested (their placeholders
filled in). Through each gateway: the limit holds exactly, a 429 carries Retry-After,
and the upstream is never reached when denied.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from cluster.local.procs import child_preexec
from cluster.local.redis_proc import free_port
from tests.conftest import Cluster, eventually

pytestmark = pytest.mark.timeout(60)

GATEWAYS = Path(__file__).resolve().parents[2] / "compose" / "gateways"
LIMIT = 5  # rule `basic` of tests/conftest.py RULES: 5 per hour


class Upstream:
    """The app behind the gateway: counts the requests that reach it."""

    def __init__(self) -> None:
        self.hits = 0
        self.ratelimit_seen: list[str | None] = []  # the RateLimit request header of each hit
        self.runner: web.AppRunner | None = None
        self.port = free_port()

    async def start(self) -> None:
        async def hello(request: web.Request) -> web.Response:
            self.hits += 1
            self.ratelimit_seen.append(request.headers.get("RateLimit"))
            return web.Response(text="hello from upstream")

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", hello)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    app = Upstream()
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


def _fill(template: str, values: dict[str, str], braces: tuple[str, str]) -> str:
    for name, value in values.items():
        template = template.replace(braces[0] + name + braces[1], value)
    return template


def _gateway_command(name: str, workdir: Path, values: dict[str, str]) -> list[str]:
    """Write the gateway's config from compose/gateways/ and return its command line."""
    if name == "nginx":
        conf = workdir / "nginx.conf"
        conf.write_text(_fill((GATEWAYS / "nginx.conf").read_text(), values, ("{", "}")))
        return ["nginx", "-c", str(conf), "-p", str(workdir)]
    if name == "caddy":
        conf = workdir / "Caddyfile"
        conf.write_text(_fill((GATEWAYS / "Caddyfile").read_text(), values, ("{{", "}}")))
        return ["caddy", "run", "--config", str(conf), "--adapter", "caddyfile"]
    conf = workdir / "haproxy.cfg"
    conf.write_text(_fill((GATEWAYS / "haproxy.cfg").read_text(), values, ("{", "}")))
    shutil.copy(GATEWAYS / "shardlimit.lua", workdir / "shardlimit.lua")
    return ["haproxy", "-f", str(conf), "-db"]


BINARIES = {"nginx": "nginx", "caddy": "caddy", "haproxy": "haproxy"}


@contextlib.asynccontextmanager
async def running(
    gateway: str, router: str, upstream: Upstream, workdir: Path
) -> AsyncIterator[str]:
    """`gateway` from its compose/gateways/ config, in front of `upstream`, asking the
    router at `router` (host:port), rule `basic`: the URL of its /orders once it answers."""
    binary = shutil.which(BINARIES[gateway]) or shutil.which(f"/usr/sbin/{BINARIES[gateway]}")
    if binary is None:
        pytest.skip(f"{gateway} is not installed (`make test` installs it with apt-get)")
    port = free_port()
    values = {
        "workdir": str(workdir),
        "port": str(port),
        "router": router,
        "upstream": f"127.0.0.1:{upstream.port}",
        "rule": "basic",
    }
    command = [binary, *_gateway_command(gateway, workdir, values)[1:]]
    log = (workdir / f"{gateway}.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        *command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=child_preexec, cwd=workdir
    )
    url = f"http://127.0.0.1:{port}/orders"
    try:
        async with aiohttp.ClientSession() as http:

            async def listening() -> bool:
                if proc.returncode is not None:
                    text = (workdir / f"{gateway}.log").read_text(errors="replace")
                    raise AssertionError(f"{gateway} exited with {proc.returncode}:\n{text}")
                try:
                    async with http.get(url, headers={"X-Api-Key": "warm-up"}) as resp:
                        return resp.status < 600
                except aiohttp.ClientError:
                    return False

            await eventually(listening, within=20)
        upstream.hits = 0
        upstream.ratelimit_seen.clear()
        yield url
    finally:
        if proc.returncode is None:
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        log.close()


@pytest.mark.parametrize("gateway", ["nginx", "caddy", "haproxy"])
async def test_the_limit_holds_exactly_through_the_gateway(
    gateway: str, cluster: Cluster, upstream: Upstream, tmp_path: Path
) -> None:
    router = cluster.router_url.removeprefix("http://")
    async with running(gateway, router, upstream, tmp_path) as url, aiohttp.ClientSession() as http:
        statuses, retry_after, bodies, ratelimit = [], [], [], []
        for _ in range(LIMIT + 3):
            async with http.get(url, headers={"X-Api-Key": f"{gateway}-key"}) as resp:
                statuses.append(resp.status)
                retry_after.append(resp.headers.get("Retry-After"))
                ratelimit.append(resp.headers.get("RateLimit"))
                bodies.append(await resp.text())
        # Another key has its own budget.
        async with http.get(url, headers={"X-Api-Key": f"{gateway}-other"}) as resp:
            other = resp.status
    assert statuses == [200] * LIMIT + [429] * 3
    assert all(b == "hello from upstream" for b in bodies[:LIMIT])
    assert all(r is not None and 1 <= int(r) <= 3600 for r in retry_after[LIMIT:])
    assert other == 200
    assert upstream.hits == LIMIT + 1  # the denied requests never reached it
    # RateLimit on an allowed response: nginx and HAProxy put it there; Caddy's
    # copy_headers puts it on the request to the upstream instead.
    remaining = [f'"basic.0";r={LIMIT - 1 - i};' for i in range(LIMIT)]
    on_client = [(h or "").partition("t=")[0] for h in ratelimit[:LIMIT]]
    on_upstream = [(h or "").partition("t=")[0] for h in upstream.ratelimit_seen[:LIMIT]]
    if gateway == "caddy":
        assert (on_client, on_upstream) == ([""] * LIMIT, remaining)
    else:
        assert (on_client, on_upstream) == (remaining, [""] * LIMIT)
    status, usage = await cluster.get(f"/v1/usage?key={gateway}-key&rule=basic")
    assert status == 200 and usage["limits"][0]["remaining"] == 0


# What each gateway answers when shardlimit refuses the question (no key header, or
# one sent twice): nginx's auth_request takes any other answer than 2xx/401/403 for an
# error (500); Caddy passes shardlimit's 400 on; the HAProxy action denies with 400.
REFUSED = {"nginx": 500, "caddy": 400, "haproxy": 400}


@pytest.mark.parametrize("gateway", ["nginx", "caddy", "haproxy"])
async def test_a_request_no_limit_can_bind_never_reaches_the_upstream(
    gateway: str, cluster: Cluster, upstream: Upstream, tmp_path: Path
) -> None:
    """Without the key header, or with two of them (the app may read one, the limit
    would be keyed by the other), the request is refused and nothing is counted."""
    router = cluster.router_url.removeprefix("http://")
    twice = CIMultiDict([("X-Api-Key", f"{gateway}-k"), ("X-Api-Key", f"{gateway}-junk")])
    async with running(gateway, router, upstream, tmp_path) as url, aiohttp.ClientSession() as http:
        statuses = []
        for headers in (twice, twice, {}, {"X-Api-Key": ""}):
            async with http.get(url, headers=headers) as resp:
                statuses.append(resp.status)
    assert statuses == [REFUSED[gateway]] * 4
    assert upstream.hits == 0
    for key in (f"{gateway}-k", f"{gateway}-junk"):
        status, usage = await cluster.get(f"/v1/usage?key={key}&rule=basic")
        assert status == 200 and usage["limits"][0]["remaining"] == LIMIT


# With no router listening: nginx answers 500 (an auth_request error), Caddy 502 (its
# forward_auth's upstream is down); the HAProxy action lets the request go on.
ROUTER_GONE = {"nginx": 500, "caddy": 502, "haproxy": 200}


@pytest.mark.parametrize("gateway", ["nginx", "caddy", "haproxy"])
async def test_what_the_gateway_answers_with_the_router_gone(
    gateway: str, upstream: Upstream, tmp_path: Path
) -> None:
    router = f"127.0.0.1:{free_port()}"  # nothing listens there
    async with (
        running(gateway, router, upstream, tmp_path) as url,
        aiohttp.ClientSession() as http,
        http.get(url, headers={"X-Api-Key": "k"}) as resp,
    ):
        status = resp.status
    assert status == ROUTER_GONE[gateway]
    assert upstream.hits == (1 if status == 200 else 0)


async def test_authz_answers_for_gateways(cluster: Cluster) -> None:
    """The endpoint itself: 204 with RateLimit headers, the configured deny status with
    Retry-After, the key from a header (X-Forwarded-For: its last entry), cost."""
    base = cluster.router_url + "/v1/authz"
    async with aiohttp.ClientSession() as http:

        async def get(query: str, headers: Any = None) -> aiohttp.ClientResponse:
            async with http.get(f"{base}?{query}", headers=headers) as resp:
                await resp.read()
                return resp

        allowed = await get("rule=basic&key=a&cost=4")
        assert allowed.status == 204
        assert allowed.headers["RateLimit"] == '"basic.0";r=1;t=3000'
        assert allowed.headers["RateLimit-Policy"] == '"basic.0";q=5;w=3600'
        denied = await get("rule=basic&key=a&cost=2&deny_status=403")
        assert denied.status == 403 and int(denied.headers["Retry-After"]) > 0
        last = await get("rule=basic&key=a")
        assert last.status == 204  # the denied cost 2 consumed nothing: 1 was left
        forwarded = {"X-Forwarded-For": "6.6.6.6, 10.0.0.7"}
        for _ in range(5):
            assert (await get("rule=basic&key_header=X-Forwarded-For", forwarded)).status == 204
        assert (await get("rule=basic&key=10.0.0.7")).status == 429  # the proxy's view
        assert (await get("rule=basic&key=6.6.6.6")).status == 204
        # Two lines of the header are one list: the proxy's line, the last, gives the key.
        two_lines = CIMultiDict([("X-Forwarded-For", "7.7.7.7"), ("X-Forwarded-For", "10.0.0.8")])
        assert (await get("rule=basic&key_header=X-Forwarded-For", two_lines)).status == 204
        status, usage = await cluster.get("/v1/usage?key=10.0.0.8&rule=basic")
        assert status == 200 and usage["limits"][0]["remaining"] == LIMIT - 1
        status, usage = await cluster.get("/v1/usage?key=7.7.7.7&rule=basic")
        assert status == 200 and usage["limits"][0]["remaining"] == LIMIT
        # Any other key header given twice: which one is the client's word is unknowable.
        twice = CIMultiDict([("X-Api-Key", "k1"), ("X-Api-Key", "k2")])
        async with http.get(f"{base}?rule=basic&key_header=X-Api-Key", headers=twice) as resp:
            problem = await resp.json(content_type=None)
        assert resp.status == 400 and problem["errors"][0]["field"] == "key_header"
        assert "2 'X-Api-Key' headers" in problem["errors"][0]["message"]
        for query, field in [
            ("rule=basic", "key"),
            ("rule=basic&key_header=X-Api-Key", "key_header"),
            ("rule=basic&key=a&deny_status=500", "deny_status"),
            ("rule=basic&key=a&cost=-1", "cost"),
            ("rule=nope&key=a", "rule"),
        ]:
            async with http.get(f"{base}?{query}") as resp:
                assert resp.status == 400, query
                assert (await resp.json(content_type=None))["errors"][0]["field"] == field


async def test_usage_is_consistent_after_gateway_checks(cluster: Cluster) -> None:
    """A denied forward-auth check consumes nothing (the counter stays at the limit)."""
    async with aiohttp.ClientSession() as http:
        url = cluster.router_url + "/v1/authz?rule=basic&key=z"
        answers = []
        for _ in range(LIMIT + 2):
            async with http.get(url) as resp:
                answers.append(resp.status)
    assert answers == [204] * LIMIT + [429] * 2
    status, usage = await cluster.get("/v1/usage?key=z&rule=basic")
    assert status == 200 and usage["limits"][0]["remaining"] == 0
