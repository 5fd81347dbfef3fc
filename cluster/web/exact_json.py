"""JSON text as shardlimit reads request bodies: a number written with a fraction or an
exponent is an exact Decimal, never a float, and an integer keeps all its digits.
Amounts are exact decimals: read as a float, 99.999999999999999 would round to 100
before anything could refuse its extra decimals."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import msgspec

__all__ = ["JSONDecodeError", "loads"]

JSONDecodeError = msgspec.DecodeError
_DECODER = msgspec.json.Decoder(float_hook=Decimal)


def loads(raw: bytes | str) -> Any:
    """The value `raw` holds. Raises JSONDecodeError when it is not JSON, or nests
    arrays and objects deeper than the decoder goes."""
    try:
        return _DECODER.decode(raw)
    except RecursionError:
        raise JSONDecodeError("arrays and objects nested too deep") from None
