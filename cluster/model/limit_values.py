"""The values inside a limit document: counts, durations, exact decimal amounts and
timestamps, with their bounds, how they are read (each problem reported at its field path)
and how they are written back.

Patterns take ASCII white space and digits only, as the OpenAPI document's patterns
(ECMA 262, router/api/openapi/patterns.py) read them.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from cluster.model.errors import Problems

MAX_COUNT = 10**12
MAX_DURATION_MS = 10 * 366 * 86_400_000
MAX_AMOUNT_MINOR = 10**15  # exact in a Lua double (< 2**53)
MAX_TIMESTAMP_MS = 253_402_300_800_000  # 10000-01-01
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$")
# ASCII white space and digits only: Python's \s and \d take other Unicode characters too.
# At most 18 significant digits: int() refuses thousands of them.
SPACES = r"[ \t\n\r\f\v]*"
NUMBER = r"0*([0-9]{1,18})"
_DURATION = re.compile(rf"{SPACES}{NUMBER}{SPACES}(ms|s|m|h|d){SPACES}")
# Decimal() also reads underscores anywhere, non-ASCII digits and exponents it cannot hold.
DECIMAL_TEXT = rf"{SPACES}[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{{1,17}})?{SPACES}"
_DECIMAL_TEXT = re.compile(DECIMAL_TEXT)
UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def format_duration(ms: int) -> str:
    for unit in ("d", "h", "m", "s"):
        size = UNIT_MS[unit]
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def format_amount(minor: int, scale: int) -> str:
    """Minor units -> exact decimal string ("5000000", 2 -> "50000.00")."""
    sign = "-" if minor < 0 else ""
    minor = abs(minor)
    if scale == 0:
        return f"{sign}{minor}"
    whole, frac = divmod(minor, 10**scale)
    return f"{sign}{whole}.{frac:0{scale}d}"


def format_timestamp(ms: int) -> str:
    """Unix ms -> RFC 3339 in UTC ("2026-12-01T00:00:00Z", milliseconds when present)."""
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{ms % 1000:03d}Z" if ms % 1000 else f"{text}Z"


def parse_timestamp(value: Any, path: str, problems: Problems) -> int | None:
    """An RFC 3339 date-time with an offset ("2026-12-01T00:00:00Z") -> Unix ms."""
    if not isinstance(value, str) or not _RFC3339.match(value):
        problems.add(path, "must be an RFC 3339 date-time with an offset: 2026-12-01T00:00:00Z")
        return None
    try:
        moment = datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    except ValueError:
        problems.add(path, "is not a valid date-time")
        return None
    ms = (moment - _EPOCH) // timedelta(milliseconds=1)
    if not 0 <= ms < MAX_TIMESTAMP_MS:
        problems.add(path, "must be in the years 1970 to 9999")
        return None
    return ms


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_duration(
    value: Any, path: str, problems: Problems, maximum: int = MAX_DURATION_MS
) -> int:
    """`"500ms"`, `"1s"`, `"1m"`, `"1h"`, `"1d"` or an integer number of ms; > 0."""
    ms: int | None = None
    if is_int(value):
        ms = value
    elif isinstance(value, str):
        match = _DURATION.fullmatch(value)
        if match:
            ms = int(match.group(1)) * UNIT_MS[match.group(2)]
    if ms is None:
        problems.add(path, "must be a duration like '500ms', '1s', '1m', '1h', '1d' or ms")
        return 0
    if ms <= 0:
        problems.add(path, "must be greater than zero")
        return 0
    if ms > maximum:
        problems.add(path, f"must be at most {format_duration(maximum)}")
        return 0
    return ms


def parse_positive_int(value: Any, path: str, problems: Problems, maximum: int = MAX_COUNT) -> int:
    if not is_int(value):
        problems.add(path, "must be an integer")
        return 0
    if value < 1:
        problems.add(path, "must be at least 1")
        return 0
    if value > maximum:
        problems.add(path, f"must be at most {maximum}")
        return 0
    return int(value)


def parse_decimal(value: Any, path: str, problems: Problems) -> Decimal | None:
    """An exact decimal from a JSON number (read as a Decimal or an int: a float has
    lost digits already) or a string; None after reporting a problem."""
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal | str):
        problems.add(path, "must be a decimal number or a string holding one")
        return None
    if isinstance(value, str) and not _DECIMAL_TEXT.fullmatch(value):
        problems.add(path, "is not a decimal number")
        return None
    if isinstance(value, float):  # from code, not from a request: its shortest repr
        value = repr(value)
    try:
        number = value if isinstance(value, Decimal) else Decimal(value)
    except InvalidOperation:
        problems.add(path, "is not a decimal number")
        return None
    if not number.is_finite():
        problems.add(path, "must be finite")
        return None
    return number


def to_minor_units(number: Decimal, scale: int, path: str, problems: Problems) -> int | None:
    """Exact conversion to integer minor units; refuses extra decimal places."""
    if number > 0 and number.adjusted() > 18:  # "1e999999999": scaleb() would overflow
        problems.add(path, f"must be at most {format_amount(MAX_AMOUNT_MINOR, scale)}")
        return None
    # "1e-99999999": scaleb() would underflow to 0 rather than show the decimals.
    if number != 0 and number.adjusted() < -scale:
        problems.add(path, f"has more than {scale} decimal places")
        return None
    scaled = number.scaleb(scale)
    if scaled != scaled.to_integral_value():
        problems.add(path, f"has more than {scale} decimal places")
        return None
    minor = int(scaled)
    if minor < 0:
        problems.add(path, "must not be negative")
        return None
    if minor > MAX_AMOUNT_MINOR:
        problems.add(path, f"must be at most {format_amount(MAX_AMOUNT_MINOR, scale)}")
        return None
    return minor
