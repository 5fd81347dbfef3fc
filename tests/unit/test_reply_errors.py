"""The lean pipe's error replies (node/store/reply_errors.py) become the exceptions
redis-py's own parser makes of them: same class, same message."""

from __future__ import annotations

from collections.abc import Callable

import hiredis
import pytest
from redis._parsers.base import BaseParser  # the reference only: the node never imports it
from redis.exceptions import InvalidResponse, NoScriptError, ResponseError

from node.store.reply_errors import reply_error

parse_error: Callable[[str], Exception] = BaseParser.parse_error
# Replies the node never meets, whose classes are newer than the oldest redis-py it runs
# on: left to ResponseError.
LEFT_OUT = {"ERR no such fieldset", "ERR problem with LDAP service"}


def _replies() -> list[str]:
    replies = ["ERR unknown command 'FOO'", "WRONGTYPE Operation against a key", "ERR", "NOPE"]
    for prefix, kind in BaseParser.EXCEPTION_CLASSES.items():
        if isinstance(kind, dict):
            replies += [f"{prefix} {text}" for text in kind]
        elif prefix in ("ASK", "MOVED"):
            replies.append(f"{prefix} 3999 127.0.0.1:6381")
        else:
            replies.append(f"{prefix} something went wrong")
    return [reply for reply in replies if reply not in LEFT_OUT]


def test_each_reply_becomes_redis_py_s_exception() -> None:
    for reply in _replies():
        ours, theirs = reply_error(reply), parse_error(reply)
        assert (type(ours), ours.args) == (type(theirs), theirs.args), reply


def test_the_reader_builds_them_in_their_slots() -> None:
    reader = hiredis.Reader(protocolError=InvalidResponse, replyError=reply_error)
    reader.feed(b"-NOSCRIPT No matching script.\r\n:1\r\n-ERR oops\r\n")
    first, second, third = reader.gets(), reader.gets(), reader.gets()
    assert isinstance(first, NoScriptError) and first.args == ("No matching script.",)
    assert second == 1
    assert type(third) is ResponseError and third.args == ("oops",)


def test_a_protocol_error_raises_redis_py_s_invalid_response() -> None:
    reader = hiredis.Reader(protocolError=InvalidResponse, replyError=reply_error)
    reader.feed(b"?not RESP\r\n")
    with pytest.raises(InvalidResponse):
        reader.gets()
