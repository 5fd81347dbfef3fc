"""router/front/offsets.py: where the request after the first `completed` ones starts."""

from __future__ import annotations

from router.front.offsets import message_start

POST = b"POST /v1/check HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}"
CHUNKED = (
    b"POST /v1/check HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
)
GET = b"GET /v1/rules HTTP/1.1\r\nHost: t\r\n\r\n"


def test_the_offset_is_right_after_the_completed_requests() -> None:
    raw = POST + CHUNKED + GET + b"POST /v1/ch"
    assert message_start(raw, 0) == 0
    assert message_start(raw, 1) == len(POST)
    assert message_start(raw, 2) == len(POST + CHUNKED)
    assert message_start(raw, 3) == len(POST + CHUNKED + GET)


def test_what_follows_may_be_malformed() -> None:
    raw = POST + b"GARBAGE\r\n\r\n"
    assert raw[message_start(raw, 1) :] == b"GARBAGE\r\n\r\n"
