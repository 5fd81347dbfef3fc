"""The lean gRPC server (router/envoy/lean_server.py, h2.py, hpack.py) against real grpcio
clients and a real cluster: the same answers as grpcio's own server, byte for byte, and
what HTTP/2 asks of it (flow control both ways, big messages, unknown methods, health
Watch, connection age)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
import redis as redis_client
from envoy.service.ratelimit.v3 import rls_pb2  # type: ignore[import-untyped]
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

from cluster.local.redis_proc import RedisProcess
from router.app import ENVOY
from router.envoy import h2_frames as f
from router.envoy.hpack import literal
from router.envoy.lean_server import LeanGrpcServer
from tests.integration.test_envoy import (
    ENVOY_YAML,
    Envoy,
    descriptor,
    start_envoy,
    stop_envoy,
)

pytestmark = pytest.mark.timeout(90)

METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"


def requests() -> list[Any]:
    """A run of calls touching each kind of answer: counted, over the limit, unknown
    descriptor and domain, overrides, hits_addend, several descriptors, and refusals."""
    build = rls_pb2.RateLimitRequest
    marketing = [("message_type", "marketing"), ("to_number", "2061234567")]
    out = [build(domain="messaging", descriptors=[descriptor(marketing)]) for _ in range(7)]
    out += [
        build(domain="messaging", descriptors=[descriptor([("to_number", "1")], hits=3)]),
        build(domain="messaging", descriptors=[descriptor([("nothing", "here")])]),
        build(domain="nowhere", descriptors=[descriptor([("a", "b")])]),
        build(domain="messaging", descriptors=[descriptor([("k", "v")], limit=(2, 2))] * 3),
        build(
            domain="messaging",
            descriptors=[descriptor(marketing), descriptor([("to_number", "9")])],
            hits_addend=2,
        ),
        build(domain="", descriptors=[descriptor([("a", "b")])]),
        build(domain="messaging"),
        build(domain="messaging", descriptors=[descriptor([("k", "v")], limit=(2, 0))]),
    ]
    return out


async def answers(envoy: Envoy) -> list[tuple[str, bytes | str]]:
    """Each call's answer: the response's bytes, or the status code and message."""
    call = envoy.channel.unary_unary(METHOD)  # bytes in, bytes out
    out: list[tuple[str, bytes | str]] = []
    for request in requests():
        try:
            out.append(("ok", await call(request.SerializeToString(), timeout=10)))
        except grpc.aio.AioRpcError as exc:
            out.append((exc.code().name, exc.details() or ""))
    return out


async def run_on(
    redis_servers: list[RedisProcess], tmp_path: Path, server: str, monkeypatch: Any
) -> list[tuple[str, bytes | str]]:
    monkeypatch.setenv("SHARDLIMIT_GRPC_SERVER", server)
    for redis in redis_servers:  # each run from empty counters
        client = redis_client.Redis(port=redis.port)
        client.flushall()
        client.close()
    (tmp_path / server).mkdir()
    envoy = await start_envoy(redis_servers, tmp_path / server, ENVOY_YAML, 2000)
    try:
        listener = envoy.cluster.runners[-1].app[ENVOY]
        assert isinstance(listener.server._server, LeanGrpcServer) == (server == "lean")
        return await answers(envoy)
    finally:
        await stop_envoy(envoy)


async def test_same_answers_as_grpcio_server(
    redis_servers: list[RedisProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lean = await run_on(redis_servers, tmp_path, "lean", monkeypatch)
    grpcio = await run_on(redis_servers, tmp_path, "grpcio", monkeypatch)
    assert lean == grpcio
    assert {kind for kind, _ in lean} == {"ok", "UNKNOWN", "INVALID_ARGUMENT"}


@pytest.fixture
async def lean(redis_servers: list[RedisProcess], tmp_path: Path) -> Any:
    started = await start_envoy(redis_servers, tmp_path, ENVOY_YAML, 2000)
    try:
        yield started
    finally:
        await stop_envoy(started)


async def test_big_request_and_answer_cross_flow_control(lean: Envoy) -> None:
    """A 3 MiB request (over the 1 MiB stream window: the server gives window back as it
    reads) and a 1000-descriptor answer with headers, both whole; over 4 MiB is refused
    as grpcio refuses it."""
    big = "x" * (3 * 1024 * 1024)
    answer = await lean.call("messaging", [("to_number", big)])
    assert answer.statuses[0].limit_remaining == 99
    many = await lean.call("messaging", *([[("to_number", "5")]] * 1000))
    assert len(many.statuses) == 1000
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await lean.call("messaging", [("to_number", "y" * (5 * 1024 * 1024))])
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_many_concurrent_calls_on_one_connection(lean: Envoy) -> None:
    calls = [lean.call("messaging", [("to_number", f"c{i % 7}")]) for i in range(300)]
    done = await asyncio.gather(*calls)
    assert sorted(100 - d.statuses[0].limit_remaining for d in done)[-1] == 300 // 7 + 1


async def test_unknown_method_and_health_watch(lean: Envoy) -> None:
    unknown = lean.channel.unary_unary("/envoy.service.ratelimit.v3.RateLimitService/Nope")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await unknown(b"", timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    health = health_pb2_grpc.HealthStub(lean.channel)
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await health.Check(health_pb2.HealthCheckRequest(service="other"), timeout=10)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    watch = health.Watch(health_pb2.HealthCheckRequest(service="ratelimit"))
    first = await asyncio.wait_for(watch.read(), 10)
    assert first.status == health_pb2.HealthCheckResponse.SERVING
    watch.cancel()


async def test_connection_age_goaway_and_reconnect(
    redis_servers: list[RedisProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GRPC_MAX_CONNECTION_AGE: the server sends GOAWAY and closes; the client's calls go
    on over a new connection."""
    monkeypatch.setenv("GRPC_MAX_CONNECTION_AGE", "200ms")
    monkeypatch.setenv("GRPC_MAX_CONNECTION_AGE_GRACE", "1s")
    envoy = await start_envoy(redis_servers, tmp_path, ENVOY_YAML, 2000)
    try:
        server = envoy.cluster.runners[-1].app[ENVOY].server._server
        seen: set[int] = set()
        for index in range(12):
            answer = await envoy.call("messaging", [("to_number", "aged")])
            assert answer.statuses[0].limit_remaining == 99 - index
            seen.update(id(c) for c in server.connections)
            await asyncio.sleep(0.05)
        assert len(seen) >= 2  # a connection went away and another took over
    finally:
        await stop_envoy(envoy)


def _mangled(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        if not out:
            break
        at, how = rng.randrange(len(out)), rng.randrange(4)
        if how == 0:
            out[at] = rng.randrange(256)
        elif how == 1:
            del out[at : at + rng.randrange(1, 8)]
        elif how == 2:
            out[at:at] = rng.randbytes(rng.randrange(1, 8))
        else:
            del out[at:]
    return bytes(out)


def _connection_of_frames(rng: random.Random) -> bytes:
    """The preface, then a few of: a real call (at times mangled), padding that does not
    fit, HPACK or frames of random bytes, a CONTINUATION on another stream, odd-sized
    control frames, a message whose length prefix lies."""
    message = rls_pb2.RateLimitRequest(
        domain="messaging", descriptors=[descriptor([("to_number", "fuzz")])]
    ).SerializeToString()
    block = (
        b"\x83\x86"  # :method POST, :scheme http
        + literal(b":path", METHOD.encode())
        + literal(b"content-type", b"application/grpc")
        + literal(b"te", b"trailers")
    )
    out = [f.PREFACE, f.settings_frame({})]
    stream = 1
    for _ in range(rng.randrange(1, 6)):
        kind = rng.randrange(7)
        if kind == 0:
            call = f.frame(f.HEADERS, f.END_HEADERS, stream, block)
            call += f.frame(f.DATA, f.END_STREAM, stream, f.grpc_message(message))
            out.append(_mangled(rng, call) if rng.random() < 0.5 else call)
        elif kind == 1:
            padded = rng.choice([f.HEADERS, f.DATA])
            out.append(f.frame(padded, f.PADDED | f.END_HEADERS, stream, rng.randbytes(2)[:1]))
        elif kind == 2:
            out.append(f.frame(f.HEADERS, f.END_HEADERS, stream, rng.randbytes(40)))
        elif kind == 3:
            cut = rng.randrange(len(block))
            out.append(f.frame(f.HEADERS, 0, stream, block[:cut]))
            out.append(f.frame(f.CONTINUATION, f.END_HEADERS, stream + 2, block[cut:]))
        elif kind == 4:
            control = rng.choice([f.SETTINGS, f.PING, f.WINDOW_UPDATE, f.RST_STREAM, f.GOAWAY])
            size = rng.choice([0, 1, 4, 5, 8, 13])
            out.append(f.frame(control, 0, rng.choice([0, stream]), rng.randbytes(size)))
        elif kind == 5:
            out.append(f.frame(rng.randrange(12), rng.randrange(256), stream, rng.randbytes(20)))
        else:
            lying = b"\x00\xff\xff\xff\xff" + message
            out.append(f.frame(f.HEADERS, f.END_HEADERS, stream, block))
            out.append(f.frame(f.DATA, f.END_STREAM, stream, lying))
        stream += 2
    return b"".join(out)


async def test_mangled_http2_gets_answers_or_a_goaway_and_logs_no_error(
    lean: Envoy, caplog: pytest.LogCaptureFixture
) -> None:
    """Seeded mutations of HTTP/2 connections: each is answered, told GOAWAY or left open
    (never an exception in the protocol code, which asyncio would log as an error and
    answer by dropping the connection), and the listener then answers a real client."""
    rng = random.Random(20261128)

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", lean.port)
        writer.write(_connection_of_frames(rng))
        # Until the server closes it; or left open, when nothing in it needed a GOAWAY.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(reader.read(), 0.2)
        writer.close()

    with caplog.at_level(logging.WARNING):
        for _ in range(20):
            await asyncio.gather(*(one() for _ in range(10)))
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    answer = await lean.call("messaging", [("to_number", "after the fuzz")])
    assert answer.statuses[0].limit_remaining == 99


def _frames_in(data: bytes) -> list[tuple[int, int, bytes]]:
    """(kind, stream id, payload) of each whole frame in `data`."""
    frames, at = [], 0
    while len(data) - at >= 9:
        length = int.from_bytes(data[at : at + 3], "big")
        stream_id = int.from_bytes(data[at + 5 : at + 9], "big") & 0x7FFFFFFF
        frames.append((data[at + 3], stream_id, data[at + 9 : at + 9 + length]))
        at += 9 + length
    return frames


async def _answer_to(port: int, frames: bytes) -> list[tuple[int, int, bytes]]:
    """The server's frames after the preface, its SETTINGS and `frames`: until it closes,
    or 1 s after it went quiet."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f.PREFACE + f.settings_frame({}) + frames)
    received = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65_536), 1.0):
            received += chunk
    except TimeoutError:
        pass
    finally:
        writer.close()
    return _frames_in(received)


MAX_INCREMENT = (2**31 - 1).to_bytes(4, "big")
SELF_DEPENDENT = (3).to_bytes(4, "big") + b"\x10"  # stream 3 depending on stream 3
CONNECTION_ERRORS = {
    "SETTINGS of 3 bytes": (f.frame(f.SETTINGS, 0, 0, b"\x00\x04\x00"), f.FRAME_SIZE_ERROR),
    "SETTINGS on a stream": (f.frame(f.SETTINGS, 0, 1, b""), f.PROTOCOL_ERROR),
    "SETTINGS ACK with settings": (
        f.frame(f.SETTINGS, f.ACK, 0, bytes(6)),
        f.FRAME_SIZE_ERROR,
    ),
    "PING of 3 bytes": (f.frame(f.PING, 0, 0, b"abc"), f.FRAME_SIZE_ERROR),
    "PING on a stream": (f.frame(f.PING, 0, 1, bytes(8)), f.PROTOCOL_ERROR),
    "WINDOW_UPDATE of 0": (f.window_update(0, 0), f.PROTOCOL_ERROR),
    "connection window over 2^31-1": (
        f.frame(f.WINDOW_UPDATE, 0, 0, MAX_INCREMENT) * 2,
        f.FLOW_CONTROL_ERROR,
    ),
    "DATA on an idle stream": (f.frame(f.DATA, 0, 1, b"x"), f.PROTOCOL_ERROR),
    "RST_STREAM on an idle stream": (f.rst_stream(5, f.CANCEL), f.PROTOCOL_ERROR),
    "RST_STREAM on stream 0": (f.rst_stream(0, f.CANCEL), f.PROTOCOL_ERROR),
    "GOAWAY on a stream": (f.frame(f.GOAWAY, 0, 1, bytes(8)), f.PROTOCOL_ERROR),
    "PRIORITY of 4 bytes": (f.frame(f.PRIORITY, 0, 1, bytes(4)), f.FRAME_SIZE_ERROR),
    "HEADERS depending on their own stream": (
        f.frame(f.HEADERS, f.END_HEADERS | f.PRIORITY_FLAG, 3, SELF_DEPENDENT + b"\x83"),
        f.PROTOCOL_ERROR,
    ),
}


@pytest.mark.parametrize("case", list(CONNECTION_ERRORS))
async def test_a_connection_error_gets_a_goaway_naming_it(lean: Envoy, case: str) -> None:
    """RFC 9113's connection errors, each alone on a connection: a GOAWAY with its code."""
    frames, code = CONNECTION_ERRORS[case]
    answer = await _answer_to(lean.port, frames)
    goaways = [payload for kind, _stream, payload in answer if kind == f.GOAWAY]
    assert len(goaways) == 1, answer
    assert int.from_bytes(goaways[0][4:8], "big") == code, goaways[0]


async def test_a_stream_depending_on_itself_is_reset_and_the_connection_serves(
    lean: Envoy,
) -> None:
    priority = f.frame(f.PRIORITY, 0, 3, SELF_DEPENDENT)
    ping = f.frame(f.PING, 0, 0, b"12345678")
    answer = await _answer_to(lean.port, priority + ping)
    resets = [(stream, payload) for kind, stream, payload in answer if kind == f.RST_STREAM]
    assert resets == [(3, f.PROTOCOL_ERROR.to_bytes(4, "big"))], answer
    assert (f.PING, 0, b"12345678") in answer
    assert not [kind for kind, _stream, _payload in answer if kind == f.GOAWAY]
