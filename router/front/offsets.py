"""Where, in bytes received since a message boundary, the message after the first
`completed` ones starts: what router/front/server.py hands to aiohttp. llhttp tells no byte
positions, so it is found again by parsing prefixes (a binary search); this runs once
per handed-over connection, and only when requests were pipelined before it."""

from __future__ import annotations

import contextlib

import httptools


class _Counter:
    def __init__(self) -> None:
        self.completed = 0

    def on_message_complete(self) -> None:
        self.completed += 1


def _completed(raw: bytes) -> int:
    counter = _Counter()
    # What follows the completed messages is not ours to judge.
    with contextlib.suppress(httptools.HttpParserError, httptools.HttpParserUpgrade):
        httptools.HttpRequestParser(counter).feed_data(raw)
    return counter.completed


def message_start(raw: bytes, completed: int) -> int:
    """The offset in `raw` (starting on a message boundary) right after its first
    `completed` messages."""
    if completed == 0:
        return 0
    low, high = 1, len(raw)  # the answer is the shortest prefix holding them all
    while low < high:
        middle = (low + high) // 2
        if _completed(raw[:middle]) >= completed:
            high = middle
        else:
            low = middle + 1
    return low
