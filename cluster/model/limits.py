"""The limit model: algorithms, their parameters, parsing and validation.

A limit is pure data. Counting happens on the node (node/store/lua); this module only
describes what to count and how to name the counter (its *shape*: the parameters
that, when changed, make the old counter meaningless).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from cluster.model import algorithms as algorithm_records
from cluster.model.calendar import PERIODS, load_timezone
from cluster.model.errors import Problems

ALGORITHMS = tuple(algorithm.name for algorithm in algorithm_records.ALGORITHMS)

MAX_COUNT = 10**12
MAX_SLIDING_LOG = 10_000
MAX_DURATION_MS = 10 * 366 * 86_400_000
MAX_AMOUNT_MINOR = 10**15  # exact in a Lua double (< 2**53)
MAX_AMOUNT_SCALE = 6
# token/leaky buckets keep state in units of token*period_ms, exact in a Lua double only
# below 2**53. Bounds on each field (not on their product, which no schema can state)
# keep it there: up to 100,000,000 per period, periods up to a day.
MAX_BUCKET_SIZE = 10**8  # rate, burst, capacity
MAX_BUCKET_PERIOD_MS = 86_400_000
assert MAX_BUCKET_SIZE * MAX_BUCKET_PERIOD_MS < 2**53
MAX_LIMITS_PER_RULE = 16

MAX_TIMESTAMP_MS = 253_402_300_800_000  # 10000-01-01
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$")
# ASCII white space and digits only, as the OpenAPI document's patterns (ECMA 262) read
# them: Python's \s and \d take other Unicode characters too. At most 18 significant
# digits: int() refuses thousands of them.
SPACES = r"[ \t\n\r\f\v]*"
_NUMBER = r"0*([0-9]{1,18})"
_DURATION = re.compile(rf"{SPACES}{_NUMBER}{SPACES}(ms|s|m|h|d){SPACES}")
# Decimal() also reads underscores anywhere, non-ASCII digits and exponents it cannot hold.
DECIMAL_TEXT = rf"{SPACES}[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{{1,17}})?{SPACES}"
_DECIMAL_TEXT = re.compile(DECIMAL_TEXT)
UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """One limit of a rule. Fields unused by an algorithm stay at their defaults."""

    algorithm: str
    limit: int | None = (
        None  # fixed/sliding: limit; token: burst; leaky: capacity; calendar: max_count
    )
    window_ms: int = 0  # fixed/sliding: window; token/leaky: period
    rate: int = 0  # token/leaky
    period: str = ""  # calendar
    timezone: str = ""  # calendar
    max_amount: int | None = None  # calendar and quota, minor units
    amount_scale: int = 2  # calendar and quota
    expires_at_ms: int | None = None  # quota: Unix ms when it ends (None: lives quota_ttl)
    # fixed_window under the Envoy service only (node/store/lua/fixed_window.lua): 1 counts denied
    # hits too, 2 reports the window's end for an unused counter. Not part of the API.
    envoy_flags: int = 0

    @property
    def shape(self) -> str:
        """Counter identity: a change here starts a fresh counter."""
        a = self.algorithm
        if a == "fixed_window":
            return f"fw:{self.window_ms}"
        if a == "sliding_log":
            return f"log:{self.window_ms}"
        if a == "sliding_window":
            return f"sw:{self.window_ms}"
        if a == "token_bucket":
            return f"tb:{self.window_ms}"
        if a == "leaky_bucket":
            return f"lb:{self.window_ms}"
        if a == "quota":
            return "q"  # one stock per key and rule: limits and expiry change, it stays
        return f"cal:{self.period}:{self.timezone}"

    def to_dict(self) -> dict[str, Any]:
        """The public (API / YAML) form."""
        a = self.algorithm
        out: dict[str, Any] = {"algorithm": a}
        if a in ("fixed_window", "sliding_log", "sliding_window"):
            out.update(limit=self.limit, window=format_duration(self.window_ms))
        elif a == "token_bucket":
            out.update(rate=self.rate, period=format_duration(self.window_ms), burst=self.limit)
        elif a == "leaky_bucket":
            out.update(rate=self.rate, period=format_duration(self.window_ms), capacity=self.limit)
        elif a == "quota":
            if self.limit is not None:
                out["limit"] = self.limit
            if self.max_amount is not None:
                out["max_amount"] = format_amount(self.max_amount, self.amount_scale)
            out["amount_scale"] = self.amount_scale
            if self.expires_at_ms is not None:
                out["expires_at"] = format_timestamp(self.expires_at_ms)
        else:
            out.update(period=self.period, timezone=self.timezone)
            if self.limit is not None:
                out["max_count"] = self.limit
            if self.max_amount is not None:
                out["max_amount"] = format_amount(self.max_amount, self.amount_scale)
            out["amount_scale"] = self.amount_scale
        return out

    def to_wire(self) -> list[Any]:
        """Compact form sent router -> node."""
        out = [
            self.algorithm,
            self.limit,
            self.window_ms,
            self.rate,
            self.period,
            self.timezone,
            self.max_amount,
            self.amount_scale,
            self.expires_at_ms,
        ]
        if self.envoy_flags:
            out.append(self.envoy_flags)
        return out

    @classmethod
    def from_wire(cls, data: Any) -> LimitSpec:
        if not isinstance(data, list) or len(data) not in (8, 9, 10):
            raise ValueError("limit must be an 8- to 10-element list")
        alg, limit, window_ms, rate, period, tz, max_amount, scale = data[:8]
        expires = data[8] if len(data) >= 9 else None
        flags = data[9] if len(data) == 10 else 0
        if not isinstance(flags, int) or not 0 <= flags <= 3 or (flags and alg != "fixed_window"):
            raise ValueError("envoy flags are 0-3, for fixed_window only")
        spec = cls(alg, limit, window_ms, rate, period, tz, max_amount, scale, expires, flags)
        problems = Problems()
        parse_limit(spec.to_dict(), "limit", problems)
        problems.raise_if_any()
        return spec


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
    if not 0 < ms < MAX_TIMESTAMP_MS:
        problems.add(path, "must be between 1970 and 9999")
        return None
    return ms


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_duration(
    value: Any, path: str, problems: Problems, maximum: int = MAX_DURATION_MS
) -> int:
    """`"500ms"`, `"1s"`, `"1m"`, `"1h"`, `"1d"` or an integer number of ms; > 0."""
    ms: int | None = None
    if _is_int(value):
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
    if not _is_int(value):
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
    """An exact decimal from a JSON number or a string; None after reporting a problem."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        problems.add(path, "must be a decimal number or a string holding one")
        return None
    if isinstance(value, str) and not _DECIMAL_TEXT.fullmatch(value):
        problems.add(path, "is not a decimal number")
        return None
    try:
        # repr() of a float is the shortest string that round-trips: 0.1 -> "0.1".
        number = Decimal(value if isinstance(value, str) else repr(value))
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


_KNOWN_FIELDS = {
    "fixed_window": {"algorithm", "limit", "window"},
    "sliding_log": {"algorithm", "limit", "window"},
    "sliding_window": {"algorithm", "limit", "window"},
    "token_bucket": {"algorithm", "rate", "period", "burst"},
    "leaky_bucket": {"algorithm", "rate", "period", "capacity"},
    "calendar": {"algorithm", "period", "timezone", "max_count", "max_amount", "amount_scale"},
    "quota": {"algorithm", "limit", "max_amount", "amount_scale", "expires_at"},
}


def parse_limit(data: Any, path: str, problems: Problems) -> LimitSpec | None:
    """Validate one limit document; report every problem, return None if any."""
    if not isinstance(data, dict):
        problems.add(path, "must be an object")
        return None
    before = len(problems.errors)
    algorithm = data.get("algorithm")
    if not isinstance(algorithm, str) or algorithm not in algorithm_records.BY_NAME:
        problems.add(f"{path}.algorithm", f"must be one of: {', '.join(ALGORITHMS)}")
        return None
    for name in sorted(set(data) - _KNOWN_FIELDS[algorithm]):
        problems.add(f"{path}.{name}", f"is not a parameter of {algorithm}")
    spec: LimitSpec
    if algorithm in ("fixed_window", "sliding_log", "sliding_window"):
        maximum = MAX_SLIDING_LOG if algorithm == "sliding_log" else MAX_COUNT
        limit = parse_positive_int(data.get("limit"), f"{path}.limit", problems, maximum)
        window = parse_duration(data.get("window"), f"{path}.window", problems)
        spec = LimitSpec(algorithm, limit=limit, window_ms=window)
    elif algorithm in ("token_bucket", "leaky_bucket"):
        size_name = "burst" if algorithm == "token_bucket" else "capacity"
        rate = parse_positive_int(data.get("rate"), f"{path}.rate", problems, MAX_BUCKET_SIZE)
        period = parse_duration(
            data.get("period"), f"{path}.period", problems, MAX_BUCKET_PERIOD_MS
        )
        size = rate  # the default; reported at rate if wrong
        if size_name in data:
            size = parse_positive_int(
                data[size_name], f"{path}.{size_name}", problems, MAX_BUCKET_SIZE
            )
        spec = LimitSpec(algorithm, limit=size, window_ms=period, rate=rate)
    elif algorithm == "quota":
        spec = _parse_quota(data, path, problems)
    else:
        spec_or_none = _parse_calendar(data, path, problems)
        if spec_or_none is None:
            return None
        spec = spec_or_none
    return spec if len(problems.errors) == before else None


def _parse_scale(data: dict[str, Any], path: str, problems: Problems) -> int:
    scale = data.get("amount_scale", 2)
    if not _is_int(scale) or not 0 <= scale <= MAX_AMOUNT_SCALE:
        problems.add(f"{path}.amount_scale", f"must be an integer from 0 to {MAX_AMOUNT_SCALE}")
        return 2
    return int(scale)


def _parse_max_amount(
    data: dict[str, Any], scale: int, path: str, problems: Problems
) -> int | None:
    if data.get("max_amount") is None:
        return None
    number = parse_decimal(data["max_amount"], f"{path}.max_amount", problems)
    if number is None:
        return None
    max_amount = to_minor_units(number, scale, f"{path}.max_amount", problems)
    if max_amount == 0:
        problems.add(f"{path}.max_amount", "must be greater than zero")
    return max_amount


def _parse_quota(data: dict[str, Any], path: str, problems: Problems) -> LimitSpec:
    """quota: `limit` and/or `max_amount` (exact, minor units), optional `expires_at`."""
    scale = _parse_scale(data, path, problems)
    limit = None
    if data.get("limit") is not None:
        limit = parse_positive_int(data["limit"], f"{path}.limit", problems)
    max_amount = _parse_max_amount(data, scale, path, problems)
    if data.get("limit") is None and data.get("max_amount") is None:
        problems.add(path, "quota needs limit, max_amount or both")
    expires = None
    if data.get("expires_at") is not None:
        expires = parse_timestamp(data["expires_at"], f"{path}.expires_at", problems)
    return LimitSpec(
        "quota", limit=limit, max_amount=max_amount, amount_scale=scale, expires_at_ms=expires
    )


def expired_quotas(limits: tuple[LimitSpec, ...], path: str, problems: Problems) -> None:
    """A problem for each quota whose expires_at is not in the future. Checked where a
    rule is written or given inline, not when a stored rule is read back: a quota that
    has since expired stays a valid rule (it denies every check)."""
    now_ms = int(time.time() * 1000)
    for index, spec in enumerate(limits):
        if spec.expires_at_ms is not None and spec.expires_at_ms <= now_ms:
            problems.add(f"{path}[{index}].expires_at", "must be in the future")


def _parse_calendar(data: dict[str, Any], path: str, problems: Problems) -> LimitSpec | None:
    period = data.get("period")
    if period not in PERIODS:
        problems.add(f"{path}.period", f"must be one of: {', '.join(PERIODS)}")
        period = ""
    tz_name = data.get("timezone", "UTC")
    if not isinstance(tz_name, str):
        problems.add(f"{path}.timezone", "must be an IANA timezone name")
        tz_name = ""
    else:
        try:
            load_timezone(tz_name)
        except ValueError as exc:
            problems.add(f"{path}.timezone", str(exc))
    scale = _parse_scale(data, path, problems)
    max_count = None
    if data.get("max_count") is not None:
        max_count = parse_positive_int(data["max_count"], f"{path}.max_count", problems)
    max_amount = _parse_max_amount(data, scale, path, problems)
    if data.get("max_count") is None and data.get("max_amount") is None:
        problems.add(path, "calendar needs max_count, max_amount or both")
    return LimitSpec(
        "calendar",
        limit=max_count,
        period=str(period),
        timezone=tz_name,
        max_amount=max_amount,
        amount_scale=scale,
    )


# `limits`-style rate strings: "10/second", "1000 per day", "500/7 days"; several
# separated by ";" or ","; an optional "sliding_window:" (or "fixed_window:") first.
_RATE = re.compile(
    rf"{SPACES}{_NUMBER}{SPACES}(?:/|per[ \t\n\r\f\v]){SPACES}(?:{_NUMBER})?{SPACES}"
    r"(second|minute|hour|day|month|year)s?"
    rf"{SPACES}"
)
_RATE_ALGORITHM = re.compile(rf"{SPACES}(fixed_window|sliding_window){SPACES}:")
# As in the `limits` library: a month is 30 days and a year 365 (calendar months and
# years that follow the calendar are the `calendar` algorithm's).
RATE_UNIT_MS = {
    "second": 1000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "month": 30 * 86_400_000,
    "year": 365 * 86_400_000,
}


def expand_rate_string(text: str, path: str, problems: Problems) -> list[dict[str, Any]]:
    """A rate string -> limit documents (fixed_window unless it starts with
    "sliding_window:"); a problem at `path` for each part that is not a rate."""
    algorithm = "fixed_window"
    named = _RATE_ALGORITHM.match(text)
    if named:
        algorithm, text = named.group(1), text[named.end() :]
    out: list[dict[str, Any]] = []
    for part in re.split(r"[;,]", text.lower()):
        match = _RATE.fullmatch(part)
        if match is None:
            problems.add(path, f"'{part.strip()}' is not a rate like '10/second' or '500/7 days'")
            continue
        count, multiple, unit = int(match.group(1)), int(match.group(2) or 1), match.group(3)
        window_ms = multiple * RATE_UNIT_MS[unit]
        out.append({"algorithm": algorithm, "limit": count, "window": f"{window_ms}ms"})
    return out


def parse_limits(data: Any, path: str, problems: Problems) -> tuple[LimitSpec, ...]:
    """A non-empty list of limits with distinct shapes (each shape is one counter).
    Rate strings stand for fixed or sliding windows: the whole list ("10/second;1000/day")
    or any item of it."""
    if isinstance(data, str):
        data = [data]
    if isinstance(data, list) and any(isinstance(item, str) for item in data):
        before = len(problems.errors)
        expanded: list[Any] = []
        for index, item in enumerate(data):
            if isinstance(item, str):
                expanded += expand_rate_string(item, f"{path}[{index}]", problems)
            else:
                expanded.append(item)
        if len(problems.errors) != before:
            return ()
        data = expanded
    if not isinstance(data, list) or not data:
        problems.add(path, "must be a non-empty list of limits (or a rate like '10/second')")
        return ()
    if len(data) > MAX_LIMITS_PER_RULE:
        problems.add(path, f"must hold at most {MAX_LIMITS_PER_RULE} limits")
        return ()
    specs: list[LimitSpec] = []
    seen: dict[str, int] = {}
    for index, item in enumerate(data):
        spec = parse_limit(item, f"{path}[{index}]", problems)
        if spec is None:
            continue
        if spec.shape in seen:
            problems.add(
                f"{path}[{index}]",
                f"counts the same counter as {path}[{seen[spec.shape]}] "
                "(same algorithm and window/period); merge them",
            )
            continue
        seen[spec.shape] = index
        specs.append(spec)
    return tuple(specs)
