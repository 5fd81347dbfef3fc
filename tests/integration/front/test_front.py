"""The router's lean HTTP front (router/front/server.py) over raw sockets: the same bytes as
aiohttp for /v1/check and /v1/check/batch, HTTP/1.1 semantics, and the hand-over of
everything else to aiohttp on the same connection."""

from __future__ import annotations

import asyncio
import gzip
import logging
import re
import signal
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
import redis
import trustme
from aiohttp import web

from cluster.local.redis_proc import RedisProcess, free_port
from cluster.web import problem as problem_module
from cluster.web.logs import MalformedRequestFilter, quiet_malformed_requests
from cluster.web.serve import start_site
from router.app import ROUTER, create_app
from router.config import RouterConfig
from router.front.server import FrontServer, front_for
from tests.conftest import CLUSTER, Cluster, cluster_with_rules

cluster = cluster_with_rules(
    """
rules:
  stock:
    limits:
      - {algorithm: quota, limit: 2}
"""
)

OK = {"key": "k1", "rule": "stock", "cost": 1}
# Each test on asyncio's loop and on uvloop's, whose TCP and TLS transports the router
# runs on (tests/conftest.py).
BOTH_LOOPS = True
DATE = re.compile(rb"\r\nDate: [^\r]*\r\n")
GZIP = "Content-Encoding: gzip\r\n"


async def _read_answer(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    found = re.search(rb"\r\nContent-Length: (\d+)\r\n", head)
    length = int(found.group(1)) if found else 0
    return head + await reader.readexactly(length)


async def exchange(
    port: int, data: bytes, answers: int = 1, context: ssl.SSLContext | None = None
) -> list[bytes]:
    """Send `data` on a new connection; the next `answers` answers, Date masked."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        writer.write(data)
        got = [await asyncio.wait_for(_read_answer(reader), 10) for _ in range(answers)]
    finally:
        writer.close()
    return [DATE.sub(b"\r\nDate: -\r\n", answer) for answer in got]


def post(path: str, body: bytes, extra: str = "", version: str = "1.1") -> bytes:
    head = f"POST {path} HTTP/{version}\r\nHost: t\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def check(body: object, extra: str = "") -> bytes:
    return post("/v1/check", orjson.dumps(body), extra)


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def _until_in_flight(port: int, node: str) -> None:
    """Until the router on `port` has a batch in flight to `node` (its /metrics gauge)."""
    wanted = f'shardlimit_node_inflight_requests{{node="{node}"}} 1.0'.encode()
    deadline = time.monotonic() + 10
    while wanted not in (await exchange(port, b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n"))[0]:
        assert time.monotonic() < deadline, "the check never reached its node"
        await asyncio.sleep(0.02)


def _flush(servers: list[RedisProcess]) -> None:
    for server in servers:
        client = redis.Redis(port=server.port)
        client.flushall()
        client.close()


@pytest.fixture
async def aiohttp_port(cluster: Cluster) -> int:
    """The same router app, also on a plain aiohttp listener."""
    port = free_port()
    await start_site(cluster.runners[-1], "127.0.0.1", port)
    return port


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/check", OK),  # 200 and its RateLimit headers
        ("/v1/check", {"key": "k1", "rule": "stock", "cost": 3}),  # 429, Retry-After
        ("/v1/check", {"key": "k1", "rule": "stock", "cost": "x"}),  # 400 field problem
        ("/v1/check", {"key": "k1", "rule": "nope"}),  # 404 unknown rule
        ("/v1/check", b"{not json"),  # 400 malformed
        ("/v1/check/batch", {"checks": [OK, {**OK, "cost": 5}]}),
        ("/v1/check/batch", {"checks": []}),
        ("/v1/check", b"x" * (1024 * 1024 + 1)),  # 413 (aiohttp answers it)
        ("/v1/check/nope", OK),  # 404 (aiohttp answers it)
    ],
)
async def test_answers_are_byte_for_byte_aiohttp_s(
    cluster: Cluster, aiohttp_port: int, path: str, body: object
) -> None:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    front = await exchange(_port(cluster.router_url), post(path, raw))
    _flush(cluster.redis)
    plain = await exchange(aiohttp_port, post(path, raw))
    assert front == plain
    assert re.match(rb"HTTP/1.1 (200|4\d\d) ", front[0])


@pytest.mark.parametrize(
    ("request_bytes", "answers", "status"),
    [
        (b"GET /v1/check HTTP/1.1\r\nHost: t\r\n\r\n", 1, b"405"),
        (check(OK, "Expect: 100-continue\r\n"), 2, b"100"),
        (check(OK, "Host: u\r\n"), 1, b"400"),  # a second Host
        (check(OK, "Content-Type: a\r\nContent-Type: b\r\n"), 1, b"400"),
        (check(OK, "X-Long: " + "x" * 9000 + "\r\n"), 1, b"400"),
        (check(OK, "Content-Encoding: gzip\r\n"), 1, b"400"),  # not gzip: unreadable
        (check(OK).replace(b"Host: t\r\n", b""), 1, b"400"),  # HTTP/1.1 needs a Host
    ],
)
async def test_what_aiohttp_judges_is_answered_by_aiohttp(
    cluster: Cluster, aiohttp_port: int, request_bytes: bytes, answers: int, status: bytes
) -> None:
    front = await exchange(_port(cluster.router_url), request_bytes, answers)
    _flush(cluster.redis)
    assert front == await exchange(aiohttp_port, request_bytes, answers)
    assert front[0].split(b" ", 2)[1] == status


async def test_a_request_aiohttp_serves_is_answered_after_the_client_half_closes(
    cluster: Cluster, aiohttp_port: int
) -> None:
    """A client that sends its request and then shuts its side (FIN) gets the answer: the
    check was counted, so losing its answer would have it counted twice on a retry."""
    for port in (_port(cluster.router_url), aiohttp_port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/v1/check?from=a-test", orjson.dumps({**OK, "key": f"fin{port}"})))
        writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), 10)  # to the end: closed after it
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200 "), answer
        status, usage = await cluster.get(f"/v1/usage?key=fin{port}&rule=stock")
        assert status == 200 and usage["limits"][0]["remaining"] == 1, usage


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"G@T /v1/check HTTP/1.1\r\nHost: t\r\n\r\n",  # not a method
        b"POST /v1/check HTTP/1.1\r\nHost: t\r\nContent-Length: -1\r\n\r\n",
        b"POST /v1/check HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxy",
        check(OK, "X-Long: " + "x" * 9000 + "\r\n"),  # over aiohttp's header limit
        check(OK, "Bad Header: 1\r\n"),  # a space in a header's name
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",  # HTTP/2's preface on an HTTP/1.1 port
    ],
)
async def test_a_request_that_cannot_be_read_is_answered_with_a_problem(
    cluster: Cluster, aiohttp_port: int, request_bytes: bytes
) -> None:
    """The router's port and a plain aiohttp one answer alike: a problem+json 400 that
    says what was wrong, and the connection closed."""
    for port in (_port(cluster.router_url), aiohttp_port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes)
        answer = await asyncio.wait_for(reader.read(), 10)  # to the end: closed after it
        writer.close()
        head, body = answer.split(b"\r\n\r\n", 1)
        # aiohttp answers in HTTP/1.0 where it could not read the request's version.
        assert re.match(rb"HTTP/1\.[01] 400 ", head), answer
        assert b"\r\nContent-Type: application/problem+json\r\n" in head
        problem = orjson.loads(body)
        assert problem["type"] == "https://shardlimit.dev/problems/malformed-request"
        assert problem["status"] == 400
        assert problem["title"] == "Bad Request"
        assert problem["detail"]


async def test_idle_connections_are_closed_after_the_keepalive_timeout(
    cluster: Cluster,
) -> None:
    runner = cluster.runners[-1]
    assert isinstance(runner, web.AppRunner)
    port = free_port()
    await start_site(runner, "127.0.0.1", port, front=front_for(runner.app, keepalive_s=0.3))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(check(OK))
    assert (await asyncio.wait_for(_read_answer(reader), 10)).startswith(b"HTTP/1.1 200 ")
    started = time.monotonic()
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the router
    assert 0.2 < time.monotonic() - started < 5
    writer.close()


async def test_a_request_that_trickles_in_is_closed_after_the_keepalive_timeout(
    cluster: Cluster,
) -> None:
    """A client that sends a request a byte at a time, never finishing it, holds no
    connection longer than the keep-alive timeout after the request's first byte."""
    runner = cluster.runners[-1]
    assert isinstance(runner, web.AppRunner)
    port = free_port()
    await start_site(runner, "127.0.0.1", port, front=front_for(runner.app, keepalive_s=0.3))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def trickle() -> None:
        for byte in b"POST /v1/check HTTP/1.1\r\nHost: t\r\nX-Slow: " + b"x" * 1000:
            writer.write(bytes((byte,)))
            await asyncio.sleep(0.05)  # the client's pace: a byte every 50 ms

    sending = asyncio.create_task(trickle())  # 52 s of it
    try:
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the router
        assert not sending.done()  # while the client was still sending
    finally:
        sending.cancel()
        writer.close()


async def test_a_body_that_never_arrives_whole_on_an_aiohttp_path_gets_a_408(
    cluster: Cluster, aiohttp_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp waits for a body for ever; the service waits BODY_WAIT_S (75 s; 0.3 here)."""
    monkeypatch.setattr(problem_module, "BODY_WAIT_S", 0.3)
    for port in (_port(cluster.router_url), aiohttp_port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/check?slow HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{")
        answer = await asyncio.wait_for(_read_answer(reader), 10)
        # The rest of the body, late: aiohttp reads what comes after a closing answer for
        # up to 10 s (its lingering close), and a client's close does not end that wait.
        writer.write(b" " * 99)
        writer.close()
        head, body = answer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 408 "), answer
        assert orjson.loads(body)["type"].endswith("/request-timeout")


async def test_pipelined_requests_are_answered_in_order(cluster: Cluster) -> None:
    costs = [1 + i % 3 for i in range(20)]
    bodies = [{"key": f"p{i}", "rule": "stock", "cost": cost} for i, cost in enumerate(costs)]
    answers = await exchange(
        _port(cluster.router_url), b"".join(check(b) for b in bodies), answers=len(bodies)
    )
    for body, cost, answer in zip(bodies, costs, answers, strict=True):
        status = 200 if cost <= 2 else 429
        assert answer.startswith(f"HTTP/1.1 {status} ".encode())
        assert orjson.loads(answer.split(b"\r\n\r\n", 1)[1])["key"] == body["key"]


async def test_a_connection_is_handed_to_aiohttp_at_its_first_other_request(
    cluster: Cluster,
) -> None:
    rules = b"GET /v1/rules HTTP/1.1\r\nHost: t\r\n\r\n"
    answers = await exchange(
        _port(cluster.router_url), check(OK) + rules + check(OK) + check(OK), answers=4
    )
    assert [a.split(b" ", 2)[1] for a in answers] == [b"200", b"200", b"200", b"429"]
    assert b'"stock"' in answers[1]


async def test_connection_close_and_http_1_0(cluster: Cluster) -> None:
    port = _port(cluster.router_url)
    for request, connection in [
        (check(OK, "Connection: close\r\n"), b"Connection: close\r\n"),
        (post("/v1/check", orjson.dumps(OK), version="1.0"), None),
    ]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request + request)  # the second is never answered
        answer = await asyncio.wait_for(reader.read(), 10)  # up to the close
        writer.close()
        assert answer.count(b"HTTP/1.") == 1
        if connection:
            assert connection in answer
    keep = post("/v1/check", orjson.dumps(OK), "Connection: keep-alive\r\n", version="1.0")
    answers = await exchange(port, keep + keep, answers=2)
    assert all(a.startswith(b"HTTP/1.0 ") and b"Connection: keep-alive" in a for a in answers)


@pytest.mark.parametrize("version", ["2.0", "0.9"])
async def test_a_request_line_of_another_http_version_is_a_505_and_the_end(
    cluster: Cluster, aiohttp_port: int, version: str
) -> None:
    """llhttp reads these request lines; the answer is a 505 over HTTP/1.1 after what the
    connection is owed, and nothing after it on the connection is read or counted."""
    port = _port(cluster.router_url)
    key = {**OK, "key": f"version-{version}"}
    other = f"GET /healthz HTTP/{version}\r\nHost: t\r\n\r\n".encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(check(key) + other + check(key))
    answer = await asyncio.wait_for(reader.read(), 10)  # up to the close
    writer.close()
    first, refused = answer.split(b"HTTP/1.1 505 ", 1)
    assert first.startswith(b"HTTP/1.1 200 ") and first.count(b"HTTP/") == 1, answer
    head, body = refused.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP Version Not Supported\r\n"), head
    assert f"\r\nContent-Length: {len(body)}\r\n".encode() in head, answer  # then nothing
    assert b"application/problem+json" in head and b"Connection: close" in head, head
    problem = orjson.loads(body)
    assert problem["type"].endswith("/http-version-not-supported"), problem
    assert problem["detail"] == f"HTTP/{version} is not served here: use HTTP/1.1"
    # The check after the refused request was not counted: one of the two is left.
    answers = await exchange(port, check(key) + check(key), answers=2)
    assert [a.split(b" ", 2)[1] for a in answers] == [b"200", b"429"]
    # aiohttp, which answers in the version claimed, answers the same problem.
    [plain] = await exchange(aiohttp_port, other)
    assert plain.split(b" ", 2)[1] == b"505", plain
    assert orjson.loads(plain.split(b"\r\n\r\n", 1)[1]) == problem


@pytest.mark.parametrize(("version", "status"), [("1.2", 505), ("3.0", 505), ("1.10", 400)])
async def test_a_version_llhttp_does_not_read_is_a_505_when_well_formed(
    cluster: Cluster, version: str, status: int
) -> None:
    request = post("/v1/check", orjson.dumps(OK), version=version)
    [answer] = await exchange(_port(cluster.router_url), request)
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.split(b" ", 2)[1] == str(status).encode(), answer
    problem = orjson.loads(body)
    if status == 505:
        assert problem["detail"] == f"HTTP/{version} is not served here: use HTTP/1.1"
    else:
        assert problem["type"].endswith("/malformed-request"), problem


async def test_a_chunked_body(cluster: Cluster) -> None:
    body = orjson.dumps(OK)
    chunked = (
        b"POST /v1/check HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n%s\r\n" % (5, body[:5])
        + b"%x\r\n%s\r\n" % (len(body) - 5, body[5:])
        + b"0\r\n\r\n"
    )
    [answer] = await exchange(_port(cluster.router_url), chunked)
    assert answer.startswith(b"HTTP/1.1 200 ")


async def test_a_malformed_request_gets_400_and_the_router_keeps_serving(
    cluster: Cluster, aiohttp_port: int
) -> None:
    port = _port(cluster.router_url)
    for bad in (
        b"GARBAGE\r\n\r\n",
        check(OK) + b"POST /v1/check HTTP/1.1\r\nHost: t\r\nContent-Length: x\r\n\r\n",
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(bad)
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert b"HTTP/1.1 400 " in answer or b"HTTP/1.0 400 " in answer
    [answer] = await exchange(port, check({**OK, "key": "after"}))
    assert answer.startswith(b"HTTP/1.1 200 ")


async def test_a_malformed_request_is_logged_as_one_debug_line(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """aiohttp, which answers what llhttp refuses, would log each one as an error with a
    traceback; the service's log set-up makes it one DEBUG line, shown only at DEBUG."""
    server_log = logging.getLogger("aiohttp.server")
    quiet_malformed_requests()
    bad = b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-A: \x00\r\n\r\n"

    async def send() -> list[logging.LogRecord]:
        caplog.clear()
        reader, writer = await asyncio.open_connection("127.0.0.1", _port(cluster.router_url))
        writer.write(bad)
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert answer.startswith(b"HTTP/1.0 400 "), answer
        return [r for r in caplog.records if r.name == "aiohttp.server"]

    try:
        with caplog.at_level(logging.DEBUG, logger="aiohttp.server"):
            [record] = await send()
        assert (record.levelno, record.exc_info) == (logging.DEBUG, None)
        assert record.getMessage().startswith("Error handling request from 127.0.0.1: 400 ")
        assert "Invalid header value char" in record.getMessage()
        with caplog.at_level(logging.INFO, logger="aiohttp.server"):
            assert await send() == []
    finally:
        for quiet in [f for f in server_log.filters if isinstance(f, MalformedRequestFilter)]:
            server_log.removeFilter(quiet)


async def test_a_body_its_content_encoding_does_not_decode_is_a_400(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """gzip is decoded (aiohttp's); a body that is not what its Content-Encoding says is a
    400 problem, not a 500, and not an error in the log."""
    port = _port(cluster.router_url)
    body = orjson.dumps({**OK, "key": "gzipped"})
    [answer] = await exchange(port, post("/v1/check", gzip.compress(body), GZIP))
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    server_log = logging.getLogger("aiohttp.server")
    quiet_malformed_requests()
    try:
        with caplog.at_level(logging.INFO):
            [answer] = await exchange(port, post("/v1/check", body, GZIP))
            await asyncio.sleep(0)  # aiohttp reads what is left of the body after the answer
        head, problem = answer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 400 ") and b"application/problem+json" in head, head
        assert orjson.loads(problem)["type"].endswith("/unreadable-body"), problem
        assert b"content-encoding: gzip" in problem, problem
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    finally:
        for quiet in [f for f in server_log.filters if isinstance(f, MalformedRequestFilter)]:
            server_log.removeFilter(quiet)


async def test_the_front_answers_partial_requests_split_anywhere(cluster: Cluster) -> None:
    data = check(OK) + b"GET /v1/rules HTTP/1.1\r\nHost: t\r\n\r\n" + check(OK)
    for cut in (1, 20, len(check(OK)) - 1, len(check(OK)) + 3):
        _flush(cluster.redis)
        reader, writer = await asyncio.open_connection("127.0.0.1", _port(cluster.router_url))
        writer.write(data[:cut])
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(data[cut:])
        statuses = [
            (await asyncio.wait_for(_read_answer(reader), 10)).split(b" ", 2)[1] for _ in range(3)
        ]
        writer.close()
        assert statuses == [b"200", b"200", b"200"]


async def second_router(
    cluster: Cluster, data_dir: Path, ssl_context: ssl.SSLContext | None = None
) -> tuple[web.AppRunner, int]:
    """Another router of the same cluster, answering through the front on a free port;
    the caller cleans its runner up."""
    config = RouterConfig(
        data_dir=data_dir,
        nodes=list(cluster.router.view.topology.nodes),
        rules_file=cluster.rules_file,
    )
    app = create_app(config, None, CLUSTER)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    port = free_port()
    await start_site(runner, "127.0.0.1", port, ssl_context=ssl_context, front=front_for(app))
    return runner, port


@pytest.fixture
async def tls_router(cluster: Cluster, tmp_path: Path) -> AsyncIterator[tuple[int, ssl.SSLContext]]:
    """A second router of the same cluster, on HTTPS through the front."""
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    runner, port = await second_router(cluster, tmp_path / "tls-router", server)
    yield port, client
    await runner.cleanup()


async def test_tls_through_the_front_and_its_hand_over(
    tls_router: tuple[int, ssl.SSLContext],
) -> None:
    port, context = tls_router
    rules = b"GET /v1/rules HTTP/1.1\r\nHost: t\r\n\r\n"
    answers = await exchange(port, check(OK) + rules + check(OK), 3, context)
    assert [a.split(b" ", 2)[1] for a in answers] == [b"200", b"200", b"200"]


async def test_a_graceful_stop_writes_the_answers_in_flight_and_closes_idle_connections(
    cluster: Cluster, tmp_path: Path
) -> None:
    runner, port = await second_router(cluster, tmp_path / "second-router")
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
    idle_writer.write(check(OK))
    await asyncio.wait_for(_read_answer(idle_reader), 10)
    owner = cluster.router.view.owner("slow")
    redis_proc = cluster.redis[int(owner[1:]) - 1].proc
    assert redis_proc is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    redis_proc.send_signal(signal.SIGSTOP)  # the check stays in flight
    try:
        writer.write(check({**OK, "key": "slow"}))
        await writer.drain()
        await _until_in_flight(port, owner)
        stopping = asyncio.create_task(runner.cleanup())
        assert await asyncio.wait_for(idle_reader.read(), 10) == b""  # closed at once
        assert not stopping.done()
    finally:
        redis_proc.send_signal(signal.SIGCONT)
    answer = await asyncio.wait_for(_read_answer(reader), 10)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert await asyncio.wait_for(reader.read(), 10) == b""  # then closed
    await asyncio.wait_for(stopping, 10)
    writer.close()
    idle_writer.close()


async def test_a_stream_never_split_on_a_request_boundary_is_served_and_handed_over(
    cluster: Cluster,
) -> None:
    """The bytes kept for a hand-over drop completed requests past a limit (tiny here)."""
    runner = cluster.runners[-1]
    assert isinstance(runner, web.AppRunner)
    app = runner.app

    def front(server: web.Server) -> FrontServer:
        return FrontServer(server, app[ROUTER], app.logger, region_limit=300)

    port = free_port()
    await start_site(runner, "127.0.0.1", port, front=front)
    requests = [check({"key": f"s{i}", "rule": "stock", "cost": 1}) for i in range(30)]
    data = b"".join(requests) + b"GET /v1/rules HTTP/1.1\r\nHost: t\r\n\r\n" + check(OK)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    step = len(requests[0]) + 7  # never on a boundary
    for start in range(0, len(data), step):
        writer.write(data[start : start + step])
        await writer.drain()
        await asyncio.sleep(0.002)
    answers = [await asyncio.wait_for(_read_answer(reader), 10) for _ in range(32)]
    writer.close()
    assert [a.split(b" ", 2)[1] for a in answers] == [b"200"] * 32
    assert b'"rules"' in answers[30]
