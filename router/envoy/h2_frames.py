"""HTTP/2 (RFC 9113) frames and the fixed parts of a gRPC answer, for the lean gRPC
server (router/envoy/h2.py).

A gRPC answer is three frames: HEADERS (`:status: 200`, `content-type:
application/grpc`), DATA (the length-prefixed message) and HEADERS with END_STREAM (the
trailers `grpc-status`, `grpc-message`); an error with no message is one HEADERS frame
holding both ("trailers-only"). Their header blocks are literals that never index
(router/envoy/hpack.py), so each is built once.
"""

from __future__ import annotations

from urllib.parse import quote

from router.envoy.hpack import encode_int, literal

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0, 1, 2, 3, 4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 5, 6, 7, 8, 9

END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# Error codes.
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 6, 7, 8, 9
ENHANCE_YOUR_CALM = 0xB

# Settings identifiers.
SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = 2**31 - 1
# What this server lets a peer send before a WINDOW_UPDATE: per stream (its
# SETTINGS_INITIAL_WINDOW_SIZE) and on the connection (raised once at the start).
RECEIVE_WINDOW = 1 << 20
MAX_MESSAGE = 4 * 1024 * 1024  # grpcio's default max_receive_message_length

# gRPC status codes (grpc.StatusCode's values).
GRPC_OK = 0
GRPC_UNKNOWN = 2
GRPC_INVALID_ARGUMENT = 3
GRPC_NOT_FOUND = 5
GRPC_RESOURCE_EXHAUSTED = 8
GRPC_UNIMPLEMENTED = 12
GRPC_INTERNAL = 13
GRPC_UNAVAILABLE = 14


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return (
        len(payload).to_bytes(3, "big")
        + bytes((kind, flags))
        + stream_id.to_bytes(4, "big")
        + payload
    )


def settings_frame(values: dict[int, int]) -> bytes:
    payload = b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in values.items())
    return frame(SETTINGS, 0, 0, payload)


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, increment.to_bytes(4, "big"))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, code.to_bytes(4, "big"))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, last_stream_id.to_bytes(4, "big") + code.to_bytes(4, "big") + debug)


def grpc_message(message: bytes) -> bytes:
    """A message as gRPC's length-prefixed framing carries it (not compressed)."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


# `:status: 200` (static index 8) and `content-type: application/grpc` (literal without
# indexing, content-type being static name 31).
RESPONSE_HEADERS = b"\x88" + encode_int(31, 4) + encode_int(16, 7) + b"application/grpc"
OK_TRAILERS = literal(b"grpc-status", b"0")
_MESSAGE_CHARS = "".join(chr(c) for c in range(0x20, 0x7F) if c != 0x25)  # but '%'
MAX_STATUS_MESSAGE = 8000  # kept under a frame's default 16 KiB with the headers


def status_trailers(code: int, message: str) -> bytes:
    """`grpc-status` and the percent-encoded `grpc-message` (gRPC's HTTP/2 protocol)."""
    block = literal(b"grpc-status", str(code).encode())
    if message:
        encoded = quote(message.encode()[:MAX_STATUS_MESSAGE], safe=_MESSAGE_CHARS)
        block += literal(b"grpc-message", encoded.encode("ascii"))
    return block


_ANSWER_HEADERS = (
    len(RESPONSE_HEADERS).to_bytes(3, "big") + bytes((HEADERS, END_HEADERS)),
    RESPONSE_HEADERS,
)
_DATA_KIND = bytes((DATA, 0))
_OK_TRAILERS = (
    len(OK_TRAILERS).to_bytes(3, "big") + bytes((HEADERS, END_HEADERS | END_STREAM)),
    OK_TRAILERS,
)


def unary_answer(stream_id: int, message: bytes) -> bytes:
    """HEADERS, one DATA frame of the message and the OK trailers: a unary call's whole
    answer, as `frame` would make the three of them."""
    sid = stream_id.to_bytes(4, "big")
    return b"".join(
        (
            _ANSWER_HEADERS[0],
            sid,
            _ANSWER_HEADERS[1],
            (len(message) + 5).to_bytes(3, "big"),
            _DATA_KIND,
            sid,
            b"\x00",
            len(message).to_bytes(4, "big"),
            message,
            _OK_TRAILERS[0],
            sid,
            _OK_TRAILERS[1],
        )
    )


# What one connection may hold: calls in flight (more are refused with REFUSED_STREAM,
# which a client retries), the size of one header block with its CONTINUATIONs, and the
# request bodies of all its open streams (without it, 1,024 streams of 4 MiB each).
MAX_STREAMS = 1024
MAX_HEADER_BLOCK = 64 * 1024
MAX_HELD = 4 * MAX_MESSAGE
