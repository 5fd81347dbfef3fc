"""Handing a client connection to aiohttp: the bytes from the start of the first request
the front does not answer itself, and aiohttp's protocol taking over the transport.
Runs once per handed-over connection, off the hot path."""

from __future__ import annotations

import asyncio

from aiohttp import web

from cluster.web.connections import aiohttp_connection
from router.front.offsets import message_start


def unfinished(region: list[bytes], completed: int) -> bytes:
    """The bytes of `region` (received since a message boundary) from the start of the
    message after its first `completed` ones."""
    raw = b"".join(region)
    return raw[message_start(raw, completed) :]


class Received:
    """The bytes a connection received since a message boundary, and the messages they
    completed: where a handed-over request starts is found in them. Past `limit` bytes,
    those of completed messages are dropped (a client whose reads never end on a request
    boundary would otherwise grow them for ever)."""

    __slots__ = ("completed", "limit", "region", "size")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.region: list[bytes] = []
        self.size = 0
        self.completed = 0

    def add(self, data: bytes, in_message: bool) -> None:
        """`data` as received; `in_message`: it continues a message begun earlier."""
        if not in_message:
            self.region = [data]
            self.size = len(data)
            self.completed = 0
            return
        self.region.append(data)
        self.size += len(data)
        if self.size > self.limit and self.completed:
            kept = unfinished(self.region, self.completed)
            self.region = [kept]
            self.size = len(kept)
            self.completed = 0

    def take_unfinished(self) -> bytes:
        """The bytes from the start of the first message not completed; none are kept."""
        leftover = unfinished(self.region, self.completed)
        self.region = []
        self.size = 0
        return leftover


def hand_over(
    transport: asyncio.Transport, server: web.Server, leftover: bytes, *, paused: bool, eof: bool
) -> None:
    """aiohttp's protocol for `server` takes over `transport` and gets `leftover` (then
    the EOF, when the client sent one); `paused`: the transport's reading is."""
    handler = aiohttp_connection(server)
    handler.connection_made(transport)
    transport.set_protocol(handler)
    if paused:
        transport.resume_reading()
    handler.data_received(leftover)
    if eof:
        handler.eof_received()
