"""The regexes and small schemas the document shares with the server's parsers: durations,
decimals, rate strings, timestamps, time zones. Unit tables come from cluster/model/limits.py
and key patterns from cluster/model/keys.py, never from copies."""

from __future__ import annotations

import re
import zoneinfo
from functools import cache
from typing import Any

from cluster.model.calendar import load_timezone
from cluster.model.keys import REQUEST_ID, RULE_NAME
from cluster.model.limits import (
    MAX_COUNT,
    MAX_DURATION_MS,
    MAX_LIMITS_PER_RULE,
    RATE_UNIT_MS,
    SPACES,
    UNIT_MS,
    format_duration,
)


def ecma(pattern: re.Pattern[str]) -> str:
    """A Python pattern anchored with \\Z, as ECMA 262 reads it (with $)."""
    return pattern.pattern.replace("\\Z", "$")


RULE_NAME_PATTERN = ecma(RULE_NAME)
REQUEST_ID_PATTERN = ecma(REQUEST_ID)

# The patterns below read white space and digits as the server's parsers do (ASCII only,
# cluster.model.limits.SPACES) and hold in ECMA 262 and Python alike (no \s, \d or \Z).
_SPACE = SPACES.removesuffix("*")


def upto(n: int) -> str:
    """A regex for the decimal integers 1..n (leading zeros allowed)."""
    digits = str(n)
    alternatives = [f"[1-9][0-9]{{0,{len(digits) - 2}}}"] if len(digits) > 1 else []
    for i, d in enumerate(digits):
        head, rest = digits[:i], len(digits) - i - 1
        low = 1 if i == 0 else 0
        if int(d) > low:
            tail = f"[0-9]{{{rest}}}" if rest else ""
            alternatives.append(f"{head}[{low}-{int(d) - 1}]{tail}")
    alternatives.append(digits)
    return f"0*(?:{'|'.join(alternatives)})"


def duration_pattern(maximum_ms: int) -> str:
    """Duration strings of 1ms..maximum_ms as cluster.model.limits.parse_duration reads them."""
    units = "|".join(
        f"{upto(maximum_ms // ms)}{SPACES}{unit}"
        for unit, ms in UNIT_MS.items()
        if maximum_ms >= ms
    )
    return f"^{SPACES}(?:{units}){SPACES}$"


def duration_schema(maximum_ms: int) -> dict[str, Any]:
    return {
        "anyOf": [
            {"type": "string", "pattern": duration_pattern(maximum_ms)},
            {"type": "integer", "minimum": 1, "maximum": maximum_ms},
        ],
        "description": "'500ms', '1s', '1m', '1h', '1d' or milliseconds; from 1ms to "
        + format_duration(maximum_ms),
    }


DURATION = duration_schema(MAX_DURATION_MS)
# cluster.model.limits.DECIMAL_TEXT, finite and not negative ("-0" is zero).
_MANTISSA = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
DECIMAL_PATTERN = (
    rf"^{SPACES}(?:\+?{_MANTISSA}|-(?:0+(?:\.0*)?|\.0+))(?:[eE][+-]?[0-9]{{1,17}})?{SPACES}$"
)
DECIMAL = {
    "anyOf": [
        {"type": "number", "minimum": 0},
        {"type": "string", "pattern": DECIMAL_PATTERN},
    ],
    "description": 'exact decimal, e.g. 12.30 or "12.30"',
}
# As DECIMAL_PATTERN, with a non-zero digit: greater than zero.
_NONZERO = r"(?:[0-9]*[1-9][0-9]*(?:\.[0-9]*)?|[0-9]*\.[0-9]*[1-9][0-9]*)"
POSITIVE_DECIMAL_PATTERN = rf"^{SPACES}\+?{_NONZERO}(?:[eE][+-]?[0-9]{{1,17}})?{SPACES}$"
POSITIVE_DECIMAL = {
    "anyOf": [
        {"type": "number", "exclusiveMinimum": 0},
        {"type": "string", "pattern": POSITIVE_DECIMAL_PATTERN},
    ],
    "description": 'exact decimal greater than zero, e.g. 12.30 or "12.30"',
}


@cache
def timezones() -> list[str]:
    """Every IANA name load_timezone accepts (tzdata's, less host-dependent ones)."""
    names = []
    for name in sorted(zoneinfo.available_timezones()):
        try:
            load_timezone(name)
        except ValueError:
            continue
        names.append(name)
    return names


def timezone_pattern() -> str:
    """The names timezones() lists, as one pattern: as exact as an enum, and
    schemathesis's coverage phase does not send one request per name (~600 each time)."""
    names = "|".join(re.sub(r"([+.])", r"\\\1", name) for name in timezones())
    return f"^(?:{names})$"


def _ci(word: str) -> str:
    return "".join(f"[{c}{c.upper()}]" if c.isalpha() else c for c in word)


# `limits`-style rate strings as cluster.model.limits.expand_rate_string reads them: a count
# of 1..MAX_COUNT per a window of at most 3660 days, in any letter case.
_WINDOW = "|".join(
    rf"(?:{upto(MAX_DURATION_MS // ms)}{SPACES})?{_ci(unit)}" for unit, ms in RATE_UNIT_MS.items()
)
_RATE = (
    rf"{SPACES}{upto(MAX_COUNT)}{SPACES}(?:/|{_ci('per')}{_SPACE}){SPACES}(?:{_WINDOW})[sS]?"
    + SPACES
)
RATE_PATTERN = (
    rf"^{SPACES}(?:(?:fixed_window|sliding_window){SPACES}:)?{_RATE}"
    rf"(?:[;,]{_RATE}){{0,{MAX_LIMITS_PER_RULE - 1}}}$"
)


# An RFC 3339 date-time with an offset, fields in range (cluster.model.limits.parse_timestamp).
TIMESTAMP_PATTERN = (
    "^(?:19[7-9][0-9]|[2-9][0-9]{3})"  # 1970..9999, as the server reads it
    "-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])[Tt]"
    "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:[.][0-9]{1,9})?"
    "(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])$"
)


SIGNED_DECIMAL = {
    "anyOf": [
        {"type": "number"},
        {
            "type": "string",
            "pattern": rf"^{SPACES}[+-]?{_MANTISSA}(?:[eE][+-]?[0-9]{{1,17}})?{SPACES}$",
        },
    ],
    "description": 'exact decimal, may be negative, e.g. -12.30 or "-12.30"',
}
