"""router/channel/control_client.py reads nodes' HTTP/1.1 answers with httptools: however
the bytes arrive, Content-Length or chunked; what it cannot read is a ProtocolError, and
a connection whose stream is out of step is never reused."""

from __future__ import annotations

import asyncio

import pytest

from router.channel.control_client import MAX_HEAD_BYTES, _Connection
from router.errors import ProtocolError

BODY = b'{"node":"n1","epoch":7}'
PLAIN = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(BODY),
    BODY,
)
CHUNKED = (
    b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"a\r\n" + BODY[:10] + b"\r\n" + b"%x\r\n" % len(BODY[10:]) + BODY[10:] + b"\r\n0\r\n\r\n"
)


def _read(*pieces: bytes) -> tuple[_Connection, asyncio.Future[tuple[int, bytes]]]:
    conn = _Connection()
    conn.waiter = asyncio.get_running_loop().create_future()
    waiter = conn.waiter
    for piece in pieces:
        conn.data_received(piece)
    return conn, waiter


async def test_an_answer_in_one_read_or_byte_by_byte() -> None:
    for pieces in ((PLAIN,), tuple(PLAIN[i : i + 1] for i in range(len(PLAIN)))):
        conn, answer = _read(*pieces)
        assert answer.result() == (200, BODY)
        assert conn.reusable


async def test_a_chunked_answer_is_joined() -> None:
    conn, answer = _read(CHUNKED[:60], CHUNKED[60:])
    assert answer.result() == (201, BODY)
    assert conn.reusable


async def test_a_connection_answers_one_request_after_another() -> None:
    conn, answer = _read(PLAIN)
    assert answer.result() == (200, BODY)
    conn.waiter = asyncio.get_running_loop().create_future()
    conn.data_received(CHUNKED)
    assert conn.waiter.result() == (201, BODY)
    assert conn.reusable


async def test_connection_close_and_unasked_bytes_end_reuse() -> None:
    closing = PLAIN.replace(b"200 OK\r\n", b"200 OK\r\nConnection: close\r\n")
    conn, answer = _read(closing)
    assert answer.result() == (200, BODY) and not conn.reusable
    conn, answer = _read(PLAIN + b"HTTP/1.1 200 OK\r\n")
    assert answer.result() == (200, BODY) and not conn.reusable
    conn, answer = _read(PLAIN)
    conn.waiter = None
    conn.data_received(b"HTTP/1.1 200 OK\r\n")
    assert not conn.reusable


@pytest.mark.parametrize(
    "raw",
    [
        b"SMTP 220 hello\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nbody",  # no Content-Length
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (64 * 1024 * 1024 + 1),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nX-Long: " + b"x" * MAX_HEAD_BYTES,
    ],
)
async def test_what_cannot_be_read_is_a_protocol_error(raw: bytes) -> None:
    conn, answer = _read(raw)
    assert isinstance(answer.exception(), ProtocolError)
    assert not conn.reusable
