"""Handing a client connection to aiohttp: the bytes from the start of the first request
the front does not answer itself, and aiohttp's protocol taking over the transport.
Runs once per handed-over connection, off the hot path."""

from __future__ import annotations

import asyncio

from aiohttp import web

from router.front.offsets import message_start


def unfinished(region: list[bytes], completed: int) -> bytes:
    """The bytes of `region` (received since a message boundary) from the start of the
    message after its first `completed` ones."""
    raw = b"".join(region)
    return raw[message_start(raw, completed) :]


def hand_over(
    transport: asyncio.Transport, server: web.Server, leftover: bytes, *, paused: bool, eof: bool
) -> None:
    """A protocol from aiohttp's `server` takes over `transport` and gets `leftover`
    (then the EOF, when the client sent one); `paused`: the transport's reading is."""
    handler = server()
    handler.connection_made(transport)
    transport.set_protocol(handler)
    if paused:
        transport.resume_reading()
    handler.data_received(leftover)
    if eof:
        handler.eof_received()
