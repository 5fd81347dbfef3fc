"""The limit model: a rule's limits (`LimitSpec`), their parsing and validation.

A limit is pure data. Counting happens on the node (node/store/lua); this module only
describes what to count and how to name the counter (its *shape*: the parameters
that, when changed, make the old counter meaningless). The values inside a limit
(counts, durations, amounts, timestamps) are read in cluster/model/limit_values.py, rate
strings in cluster/model/rate_strings.py; both are re-exported here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from cluster.model.calendar import PERIODS, load_timezone
from cluster.model.errors import Problems
from cluster.model.limit_values import (
    DECIMAL_TEXT,
    MAX_AMOUNT_MINOR,
    MAX_COUNT,
    MAX_DURATION_MS,
    MAX_TIMESTAMP_MS,
    SPACES,
    UNIT_MS,
    format_amount,
    format_duration,
    format_timestamp,
    is_int,
    parse_decimal,
    parse_duration,
    parse_positive_int,
    parse_timestamp,
    to_minor_units,
)
from cluster.model.rate_strings import RATE_UNIT_MS, expand_rate_string

__all__ = [
    "ALGORITHMS",
    "DECIMAL_TEXT",
    "MAX_AMOUNT_MINOR",
    "MAX_AMOUNT_SCALE",
    "MAX_BUCKET_PERIOD_MS",
    "MAX_BUCKET_SIZE",
    "MAX_COUNT",
    "MAX_DURATION_MS",
    "MAX_LEASES",
    "MAX_LEASE_MS",
    "MAX_LIMITS_PER_RULE",
    "MAX_SLIDING_LOG",
    "MAX_TIMESTAMP_MS",
    "RATE_UNIT_MS",
    "SPACES",
    "UNIT_MS",
    "LimitSpec",
    "expand_rate_string",
    "expired_quotas",
    "format_amount",
    "format_duration",
    "format_timestamp",
    "parse_decimal",
    "parse_duration",
    "parse_limit",
    "parse_limits",
    "parse_positive_int",
    "parse_timestamp",
    "to_minor_units",
]

# The parameters of each algorithm of cluster/model/algorithms.py, in its order (which
# checks that the two agree).
_KNOWN_FIELDS = {
    "fixed_window": {"algorithm", "limit", "window"},
    "sliding_log": {"algorithm", "limit", "window"},
    "sliding_window": {"algorithm", "limit", "window"},
    "token_bucket": {"algorithm", "rate", "period", "burst"},
    "leaky_bucket": {"algorithm", "rate", "period", "capacity"},
    "calendar": {"algorithm", "period", "timezone", "max_count", "max_amount", "amount_scale"},
    "quota": {"algorithm", "limit", "max_amount", "amount_scale", "expires_at"},
    "concurrency": {"algorithm", "limit", "lease"},
}
ALGORITHMS = tuple(_KNOWN_FIELDS)

MAX_SLIDING_LOG = 10_000
MAX_AMOUNT_SCALE = 6
# token/leaky buckets keep state in units of token*period_ms, exact in a Lua double only
# below 2**53. Bounds on each field (not on their product, which no schema can state)
# keep it there: up to 100,000,000 per period, periods up to a day.
MAX_BUCKET_SIZE = 10**8  # rate, burst, capacity
MAX_BUCKET_PERIOD_MS = 86_400_000
assert MAX_BUCKET_SIZE * MAX_BUCKET_PERIOD_MS < 2**53
MAX_LIMITS_PER_RULE = 16
MAX_LEASES = 100_000  # concurrency: leases held at once
MAX_LEASE_MS = 86_400_000  # concurrency: a lease lives at most a day unless renewed


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """One limit of a rule. Fields unused by an algorithm stay at their defaults."""

    algorithm: str
    limit: int | None = (
        None  # fixed/sliding: limit; token: burst; leaky: capacity; calendar: max_count
    )
    window_ms: int = 0  # fixed/sliding: window; token/leaky: period; concurrency: lease
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
        # Amounts are kept in minor units: read at another scale they would be misread
        # (60.00 stored as 6000 is 0.6000 at scale 4), so the scale names the counter.
        # The default adds nothing, which keeps the names counters had before it did.
        scale = "" if self.max_amount is None or self.amount_scale == 2 else f":{self.amount_scale}"
        if a == "quota":
            return "q" + scale  # one stock per key and rule: limits and expiry change, it stays
        if a == "concurrency":
            return "cc"  # one set of leases per key and rule: limit and lease change, it stays
        return f"cal:{self.period}:{self.timezone}{scale}"

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
        elif a == "concurrency":
            out.update(limit=self.limit, lease=format_duration(self.window_ms))
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


def parse_limit(data: Any, path: str, problems: Problems) -> LimitSpec | None:
    """Validate one limit document; report every problem, return None if any."""
    if not isinstance(data, dict):
        problems.add(path, "must be an object")
        return None
    before = len(problems.errors)
    algorithm = data.get("algorithm")
    if not isinstance(algorithm, str) or algorithm not in _KNOWN_FIELDS:
        problems.add(f"{path}.algorithm", f"must be one of: {', '.join(ALGORITHMS)}")
        return None
    for name in sorted(set(data) - _KNOWN_FIELDS[algorithm], key=str):  # YAML: any key type
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
    elif algorithm == "concurrency":
        limit = parse_positive_int(data.get("limit"), f"{path}.limit", problems, MAX_LEASES)
        lease = parse_duration(data.get("lease"), f"{path}.lease", problems, MAX_LEASE_MS)
        spec = LimitSpec(algorithm, limit=limit, window_ms=lease)
    else:
        spec_or_none = _parse_calendar(data, path, problems)
        if spec_or_none is None:
            return None
        spec = spec_or_none
    return spec if len(problems.errors) == before else None


def _parse_scale(data: dict[str, Any], path: str, problems: Problems) -> int:
    scale = data.get("amount_scale", 2)
    if not is_int(scale) or not 0 <= scale <= MAX_AMOUNT_SCALE:
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


def log_entries(limits: tuple[LimitSpec, ...], cost: int) -> int:
    """The sliding_log entries a check of `cost` on `limits` adds if admitted: a sliding
    log keeps one per unit, and a cost over any log's limit is never admitted."""
    logs = [s.limit for s in limits if s.algorithm == "sliding_log" and s.limit is not None]
    return cost if logs and cost <= min(logs) else 0


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
