"""The lean gRPC server's HTTP/2 pieces (router/envoy/hpack.py, h2.py): RFC 7541's own
examples for HPACK, and HTTP/2 flow control of an answer, fed frame by frame."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from router.envoy import h2_frames as f
from router.envoy import hpack
from router.envoy.h2 import H2Connection
from router.envoy.hpack import Decoder, HpackError, huffman_decode

H = bytes.fromhex


def test_rfc7541_request_examples_with_huffman() -> None:
    """RFC 7541 C.4: three requests on one connection, Huffman strings, the dynamic table."""
    decoder = Decoder()
    first = decoder.decode(H("828684418cf1e3c2e5f23a6ba0ab90f4ff"))
    assert first[-1] == (b":authority", b"www.example.com")
    second = decoder.decode(H("828684be5886a8eb10649cbf"))
    assert second[-1] == (b"cache-control", b"no-cache")
    third = decoder.decode(H("828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf"))
    assert third[-1] == (b"custom-key", b"custom-value")
    assert decoder.size == 164


def test_rfc7541_response_examples_with_eviction() -> None:
    """RFC 7541 C.6: responses with a 256-byte table, entries evicted, long Huffman codes."""
    decoder = Decoder()
    decoder.max_size = 256
    first = decoder.decode(
        H(
            "488264025885aec3771a4b6196d07abe941054d444a8200595040b8166e082a62d1bff"
            "6e919d29ad171863c78f0b97c8e9ae82ae43d3"
        )
    )
    assert list(first) == [
        (b":status", b"302"),
        (b"cache-control", b"private"),
        (b"date", b"Mon, 21 Oct 2013 20:13:21 GMT"),
        (b"location", b"https://www.example.com"),
    ]
    second = decoder.decode(H("4883640effc1c0bf"))
    assert second[0] == (b":status", b"307")
    third = decoder.decode(
        H(
            "88c16196d07abe941054d444a8200595040b8166e084a62d1bffc05a839bd9ab77ad94e7"
            "821dd7f2e6c7b335dfdfcd5b3960d5af27087f3672c1ab270fb5291f9587316065c003ed"
            "4ee5b1063d5007"
        )
    )
    assert third[-1] == (b"set-cookie", b"foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1")
    assert decoder.size == 215


def test_a_block_kept_decoded_follows_the_dynamic_table() -> None:
    """The same bytes of references name other fields once the table has changed."""
    decoder = Decoder()
    newest = b"\xbe"  # indexed: 62, the newest entry of the dynamic table
    decoder.decode(hpack.literal(b"x-a", b"1").replace(b"\x00", b"\x40", 1))  # incremental
    assert decoder.decode(newest) == ((b"x-a", b"1"),)
    assert decoder.decode(newest) == ((b"x-a", b"1"),)
    decoder.decode(hpack.literal(b"x-b", b"2").replace(b"\x00", b"\x40", 1))
    assert decoder.decode(newest) == ((b"x-b", b"2"),)
    decoder.decode(b"\x20")  # a table size update to 0 evicts every entry
    with pytest.raises(HpackError):
        decoder.decode(newest)


def test_huffman_padding_and_eos_are_refused() -> None:
    assert huffman_decode(H("a8eb10649cbf")) == b"no-cache"
    with pytest.raises(HpackError):
        huffman_decode(H("a8eb10649cbe"))  # padding not all ones
    with pytest.raises(HpackError):
        huffman_decode(H("ff"))  # padding over 7 bits
    with pytest.raises(HpackError):
        huffman_decode(H("ffffffff"))  # the EOS symbol


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.out += data

    def close(self) -> None:
        self.closed = True

    def frames(self) -> list[tuple[int, int, int, bytes]]:
        """(type, flags, stream, payload) of what was written since the last call."""
        out, at, data = [], 0, bytes(self.out)
        while at < len(data):
            length = int.from_bytes(data[at : at + 3], "big")
            kind, flags = data[at + 3], data[at + 4]
            stream = int.from_bytes(data[at + 5 : at + 9], "big")
            out.append((kind, flags, stream, data[at + 9 : at + 9 + length]))
            at += 9 + length
        self.out.clear()
        return out


class _Calls:
    def __init__(self) -> None:
        self.calls: list[tuple[int, bytes, bytes]] = []

    def call(self, connection: H2Connection, stream_id: int, path: bytes, message: bytes) -> None:
        self.calls.append((stream_id, path, message))


async def test_answer_waits_for_the_peers_window() -> None:
    """A peer that opens 10 bytes per stream gets 10 bytes of DATA, the rest after its
    WINDOW_UPDATE, and the trailers last; a request's message reaches the calls."""
    calls = _Calls()
    connection = H2Connection(calls, lambda _c: None)
    transport = _Transport()
    connection.connection_made(transport)
    assert [k for k, *_ in transport.frames()] == [f.SETTINGS, f.WINDOW_UPDATE]
    path = b"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    block = b"\x83" + b"\x04" + bytes((len(path),)) + path  # :method POST, :path literal
    connection.data_received(
        f.PREFACE
        + f.settings_frame({f.SETTINGS_INITIAL_WINDOW_SIZE: 10})
        + f.frame(f.HEADERS, f.END_HEADERS, 1, block)
        + f.frame(f.DATA, f.END_STREAM, 1, f.grpc_message(b"hello"))
    )
    assert calls.calls == [(1, path, b"hello")]
    assert transport.frames() == [(f.SETTINGS, f.ACK, 0, b"")]
    connection.respond(1, b"x" * 25)  # 30 bytes framed
    await asyncio.sleep(0)  # written at the end of the event loop's turn
    sent = transport.frames()
    assert [(k, fl, len(p)) for k, fl, _s, p in sent] == [
        (f.HEADERS, f.END_HEADERS, len(f.RESPONSE_HEADERS)),
        (f.DATA, 0, 10),
    ]
    connection.data_received(f.window_update(1, 100))
    sent = transport.frames()
    assert [(k, fl, len(p)) for k, fl, _s, p in sent] == [
        (f.DATA, 0, 20),
        (f.HEADERS, f.END_HEADERS | f.END_STREAM, len(f.OK_TRAILERS)),
    ]
    assert not connection.streams


async def test_error_is_trailers_only_and_goaway_refuses_new_streams() -> None:
    calls = _Calls()
    connection = H2Connection(calls, lambda _c: None)
    transport = _Transport()
    connection.connection_made(transport)
    transport.frames()
    block = b"\x83\x84"  # :method POST, :path /
    connection.data_received(
        f.PREFACE + f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, block)
    )  # no message at all
    await asyncio.sleep(0)
    (answer,) = transport.frames()
    assert answer[:3] == (f.HEADERS, f.END_HEADERS | f.END_STREAM, 1)
    assert f.status_trailers(f.GRPC_INTERNAL, "Expected exactly one request message") in answer[3]
    connection.go_away(1.0)
    assert transport.frames()[0][0] == f.GOAWAY
    assert transport.closed  # nothing in flight: closed at once
    connection.data_received(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 3, block))
    assert transport.frames() == [(f.RST_STREAM, 0, 3, f.REFUSED_STREAM.to_bytes(4, "big"))]


async def test_a_connection_holds_at_most_max_streams_calls() -> None:
    """Calls past MAX_STREAMS in flight are refused (REFUSED_STREAM: the client retries)."""
    calls = _Calls()
    connection = H2Connection(calls, lambda _c: None)
    transport = _Transport()
    connection.connection_made(transport)
    settings = transport.frames()[0]
    assert f.settings_frame({f.SETTINGS_MAX_CONCURRENT_STREAMS: f.MAX_STREAMS})[9:] in settings[3]
    block = b"\x83\x84"  # :method POST, :path /; no END_STREAM: each call stays open
    opened = b"".join(
        f.frame(f.HEADERS, f.END_HEADERS, 2 * i + 1, block) for i in range(f.MAX_STREAMS + 2)
    )
    connection.data_received(f.PREFACE + opened)
    assert len(connection.streams) == f.MAX_STREAMS
    refused = [frame for frame in transport.frames() if frame[0] == f.RST_STREAM]
    assert [stream for _k, _fl, stream, _p in refused] == [
        2 * f.MAX_STREAMS + 1,
        2 * f.MAX_STREAMS + 3,
    ]


async def test_a_header_block_past_its_limit_closes_the_connection() -> None:
    """CONTINUATION frames without end are a flood: past MAX_HEADER_BLOCK, GOAWAY."""
    calls = _Calls()
    connection = H2Connection(calls, lambda _c: None)
    transport = _Transport()
    connection.connection_made(transport)
    transport.frames()
    piece = b"\x00" * 16_000
    flood = f.frame(f.HEADERS, 0, 1, piece) + b"".join(
        f.frame(f.CONTINUATION, 0, 1, piece) for _ in range(f.MAX_HEADER_BLOCK // len(piece) + 1)
    )
    connection.data_received(f.PREFACE + flood)
    kinds = [k for k, *_ in transport.frames()]
    assert f.GOAWAY in kinds, kinds
    assert transport.closed


def _huffman_encode(data: bytes) -> bytes:
    """The test's own encoder, from the canonical code the decoder is built on."""
    codes: dict[int, tuple[int, int]] = {}
    for length in hpack._CODE_LENGTHS:
        for i in range(hpack._COUNT[length]):
            symbol = hpack._SYMBOLS[hpack._OFFSET[length] + i]
            codes[symbol] = (hpack._FIRST[length] + i, length)
    value, bits = 0, 0
    for byte in data:
        code, length = codes[byte]
        value, bits = (value << length) | code, bits + length
    pad = -bits % 8
    value, bits = (value << pad) | ((1 << pad) - 1), bits + pad
    return value.to_bytes(bits // 8, "big")


def test_huffman_round_trips_every_symbol_and_long_strings() -> None:
    assert _huffman_encode(b"no-cache") == H("a8eb10649cbf")
    every = bytes(range(256))
    assert huffman_decode(_huffman_encode(every)) == every
    long = bytes((i * 7919) % 256 for i in range(100_000))  # ~200 KB encoded
    assert huffman_decode(_huffman_encode(long)) == long


def test_a_truncated_header_field_is_an_hpack_error() -> None:
    for block in (b"\x40", b"\x40\x01a", b"\x04", b"\x0f\x2f\x01"):
        with pytest.raises(HpackError):
            Decoder().decode(block)


def _connected() -> tuple[H2Connection, _Transport, _Calls]:
    calls = _Calls()
    connection = H2Connection(calls, lambda _c: None)
    transport = _Transport()
    connection.connection_made(transport)
    transport.frames()
    return connection, transport, calls


def _goaway_code(transport: _Transport) -> int:
    [goaway] = [frame for frame in transport.frames() if frame[0] == f.GOAWAY]
    return int.from_bytes(goaway[3][4:8], "big")


@pytest.mark.parametrize(
    "frames",
    [
        f.frame(f.HEADERS, f.END_HEADERS | f.PADDED, 1, b""),
        f.frame(f.HEADERS, f.END_HEADERS | f.PADDED, 1, b"\x05\x83\x84"),
        f.frame(f.HEADERS, f.END_HEADERS, 1, b"\x83\x84") + f.frame(f.DATA, f.PADDED, 1, b""),
        f.frame(f.HEADERS, f.END_HEADERS, 1, b"\x83\x84") + f.frame(f.DATA, f.PADDED, 1, b"\x01"),
        f.frame(f.DATA, f.PADDED, 3, b""),  # on a stream never opened
    ],
    ids=["headers-empty", "headers-over", "data-empty", "data-all-padding", "data-no-stream"],
)
async def test_padding_that_does_not_fit_is_a_protocol_error(frames: bytes) -> None:
    connection, transport, calls = _connected()
    connection.data_received(f.PREFACE + frames)
    assert _goaway_code(transport) == f.PROTOCOL_ERROR
    assert transport.closed and calls.calls == []


async def test_a_header_field_cut_short_is_a_compression_error() -> None:
    connection, transport, _calls = _connected()
    connection.data_received(f.PREFACE + f.frame(f.HEADERS, f.END_HEADERS, 1, b"\x83\x40\x01a"))
    assert _goaway_code(transport) == f.COMPRESSION_ERROR
    assert transport.closed


async def test_request_bodies_held_past_the_limit_close_the_connection() -> None:
    """A body handed to the calls is not held; bodies of open streams past MAX_HELD are a
    flood (1,024 streams could hold 4 MiB each): GOAWAY, ENHANCE_YOUR_CALM."""
    connection, transport, calls = _connected()
    block = b"\x83\x84"  # :method POST, :path /
    connection.data_received(
        f.PREFACE
        + f.frame(f.HEADERS, f.END_HEADERS, 1, block)
        + f.frame(f.DATA, f.END_STREAM, 1, f.grpc_message(b"x" * 1000))
    )
    assert [len(message) for _s, _p, message in calls.calls] == [1000]
    assert connection.held == 0
    piece = b"\x00" * 16_000
    per_stream = f.MAX_MESSAGE // len(piece)  # under one message's limit
    streams = f.MAX_HELD // (per_stream * len(piece)) + 1
    flood = b"".join(
        f.frame(f.HEADERS, f.END_HEADERS, 2 * s + 3, block)
        + f.frame(f.DATA, 0, 2 * s + 3, piece) * per_stream
        for s in range(streams)
    )
    connection.data_received(flood)
    assert _goaway_code(transport) == f.ENHANCE_YOUR_CALM
    assert transport.closed and len(calls.calls) == 1


async def test_a_request_reaches_the_calls_whole_however_its_data_is_framed() -> None:
    """One DATA frame, several, padded, or ended by the client's trailers: the same
    message reaches the calls, and nothing stays held."""
    connection, _transport, calls = _connected()
    block = b"\x83\x84"  # :method POST, :path /
    body = f.grpc_message(b"ratelimit request")
    connection.data_received(
        f.PREFACE
        + f.frame(f.HEADERS, f.END_HEADERS, 1, block)
        + f.frame(f.DATA, f.END_STREAM, 1, body)
        + f.frame(f.HEADERS, f.END_HEADERS, 3, block)
        + f.frame(f.DATA, 0, 3, body[:7])
        + f.frame(f.DATA, f.END_STREAM, 3, body[7:])
        + f.frame(f.HEADERS, f.END_HEADERS, 5, block)
        + f.frame(f.DATA, f.END_STREAM | f.PADDED, 5, b"\x03" + body + b"\x00\x00\x00")
        + f.frame(f.HEADERS, f.END_HEADERS, 7, block)
        + f.frame(f.DATA, 0, 7, body)
        + f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 7, b"")  # trailers
    )
    assert calls.calls == [(s, b"/", b"ratelimit request") for s in (1, 3, 5, 7)]
    assert connection.held == 0


async def test_a_unary_answer_is_its_three_frames_in_one_write() -> None:
    connection, transport, _calls = _connected()
    block = b"\x83\x84"
    connection.data_received(
        f.PREFACE
        + f.frame(f.HEADERS, f.END_HEADERS, 1, block)
        + f.frame(f.DATA, f.END_STREAM, 1, f.grpc_message(b"?"))
    )
    transport.frames()
    connection.respond(1, b"answer")
    assert bytes(transport.out) == (
        f.frame(f.HEADERS, f.END_HEADERS, 1, f.RESPONSE_HEADERS)
        + f.frame(f.DATA, 0, 1, f.grpc_message(b"answer"))
        + f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, f.OK_TRAILERS)
    )
    assert not connection.streams
    assert connection.send_window == f.DEFAULT_WINDOW - len(f.grpc_message(b"answer"))
