"""The msgpack encoder the batch messages and the channel's frames share, and decoding
with one error for bytes that are no message."""

from __future__ import annotations

from typing import Final, TypeVar

import msgspec

encoder: Final = msgspec.msgpack.Encoder()
_Message = TypeVar("_Message")
# What a msgspec decoder raises for bytes that are no message: msgspec before 0.23 lets a
# string's bad UTF-8 out as UnicodeDecodeError rather than as DecodeError.
# msgspec raises RecursionError for arrays or objects nested too deep (about 1,000).
DECODE_ERRORS: Final = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)
NOT_UTF8: Final = "a string is not UTF-8"


def decoded(decoder: msgspec.msgpack.Decoder[_Message], body: bytes | memoryview) -> _Message:
    """Bad UTF-8 in a string is one DecodeError, worded the same whichever msgspec raised
    it (before 0.23 a UnicodeDecodeError, from 0.23 a DecodeError of its own wording)."""
    try:
        return decoder.decode(body)
    except UnicodeDecodeError as exc:
        raise msgspec.DecodeError(f"{NOT_UTF8}: {exc}") from None
    except msgspec.DecodeError as exc:
        if "UTF-8" in str(exc):
            raise msgspec.DecodeError(f"{NOT_UTF8}: {exc}") from None
        raise
