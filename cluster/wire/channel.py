"""The hot-path channel: one long-lived connection per router and node, each frame a
4-byte big-endian length and a msgpack body (`ChannelIn` from the router, `ChannelOut`
from the node)."""

from __future__ import annotations

import struct
from typing import Annotated, Final

import msgspec

from cluster.wire.batch import BatchReply, NonNegative, Op
from cluster.wire.codec import decoded, encoder

FRAME_HEADER: Final = struct.Struct(">I")  # the length of the msgpack body that follows
MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
# The first frame of a connection, its Hello, before the token in it is checked: what an
# unauthenticated client can make a node hold.
MAX_HELLO_BYTES: Final = 64 * 1024


class Hello(msgspec.Struct, array_like=True, frozen=True, tag="hello"):
    """The router's first frame: the cluster token (None when the cluster has none)."""

    token: str | None


class Request(msgspec.Struct, array_like=True, frozen=True, tag="batch"):
    """A batch on the channel: `Batch` with the router's id for it.

    `layout`: the `Topology.layout_id` by which the router placed every op on this node
    (each key's owner), 0 when not by one. A node whose topology has that same layout and
    is in no migration serves every op without placing it again: it would place them the
    same way. Otherwise it places each op (`Moved`, imports)."""

    id: int
    deadline_ms: Annotated[int, msgspec.Meta(gt=0)]
    ops: list[Op]
    layout: NonNegative = 0


class Welcome(msgspec.Struct, array_like=True, frozen=True, tag="welcome"):
    node: str
    epoch: int
    live: int  # the node's liveness port


class Refused(msgspec.Struct, array_like=True, frozen=True, tag="refused"):
    """Not welcome (a wrong token, a first frame that is no `Hello`): the node closes."""

    detail: str


class Reply(msgspec.Struct, array_like=True, frozen=True, tag="reply"):
    id: int
    status: int  # 200: `reply` holds the answer; else `detail` says why not
    reply: BatchReply | None = None
    detail: str = ""


ChannelIn = Hello | Request
ChannelOut = Welcome | Refused | Reply

_in_decoder: msgspec.msgpack.Decoder[ChannelIn] = msgspec.msgpack.Decoder(ChannelIn)
_out_decoder: msgspec.msgpack.Decoder[ChannelOut] = msgspec.msgpack.Decoder(ChannelOut)


def frame(message: ChannelIn | ChannelOut) -> bytes:
    """One frame: the length header, then the msgpack body."""
    buffer = bytearray(FRAME_HEADER.size)
    encoder.encode_into(message, buffer, FRAME_HEADER.size)
    FRAME_HEADER.pack_into(buffer, 0, len(buffer) - FRAME_HEADER.size)
    return bytes(buffer)


def decode_channel_in(body: bytes | memoryview) -> ChannelIn:
    """Raises msgspec.ValidationError / msgspec.DecodeError."""
    return decoded(_in_decoder, body)


def decode_channel_out(body: bytes | memoryview) -> ChannelOut:
    """Raises msgspec.ValidationError / msgspec.DecodeError."""
    return decoded(_out_decoder, body)


class FrameBuffer:
    """Bytes from a stream in, complete frame bodies out."""

    __slots__ = ("_data", "_max_bytes", "_most")

    def __init__(self, max_bytes: int = MAX_FRAME_BYTES, first_max_bytes: int = 0) -> None:
        self._data = bytearray()
        self._max_bytes = max_bytes  # the longest frame body taken
        self._most = first_max_bytes or max_bytes  # the same for the next frame

    def feed(self, data: bytes) -> list[bytes]:
        """The bodies of the frames completed by `data`, in order. Raises ValueError
        for a frame longer than `max_bytes` (`first_max_bytes` for the first frame): the
        stream cannot be trusted after."""
        buffer = self._data
        buffer += data
        bodies: list[bytes] = []
        at, size, most = 0, len(buffer), self._most
        while size - at >= 4:
            (length,) = FRAME_HEADER.unpack_from(buffer, at)
            if length > most:
                raise ValueError(f"frame of {length} bytes (at most {most})")
            end = at + 4 + length
            if end > size:
                break
            bodies.append(bytes(buffer[at + 4 : end]))
            at = end
            most = self._max_bytes
        self._most = most
        del buffer[:at]
        return bodies
