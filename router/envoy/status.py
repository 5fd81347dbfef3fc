"""One descriptor's answer as envoyproxy/ratelimit gives it (its base_limiter.go), the
overall code (service/ratelimit.go: shadow and quota mode), its RateLimit-* response
headers, and its per-descriptor stats.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from envoy.service.ratelimit.v3 import rls_pb2  # type: ignore[import-untyped]

from cluster.model import answers
from cluster.model.limits import LimitSpec
from router.envoy.descriptors import COUNTED_DENIALS, ENVOY_UNIT_MS, DescriptorLimit
from router.envoy.settings import EnvoySettings
from router.envoy.yaml_checks import MAX_UINT32

OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT
UNIT_ENUM = {
    name: rls_pb2.RateLimitResponse.RateLimit.Unit.Value(name.upper()) for name in ENVOY_UNIT_MS
}
_WINDOWS = {ms: name for name, ms in ENVOY_UNIT_MS.items()}
STAT_NAMES = (
    "total_hits",
    "over_limit",
    "over_limit_with_local_cache",
    "near_limit",
    "within_limit",
    "shadow_mode",
)
# A descriptor's hits by stat: a list in STAT_NAMES' order, these its indexes.
TOTAL, OVER, OVER_CACHED, NEAR, WITHIN, SHADOW = range(len(STAT_NAMES))


def _hits_only(hits: int) -> list[int]:
    """Stats that count `hits` in total_hits and nowhere else yet."""
    stats = [0] * len(STAT_NAMES)
    stats[TOTAL] = hits
    return stats


@dataclass
class DescriptorOutcome:
    """A checked descriptor: whether it was over, and the hits its stats count (its
    answer is the DescriptorStatus it was given to fill)."""

    over: bool  # over its limit (before shadow mode turned the code OK)
    stats: list[int]  # hits by stat, in STAT_NAMES' order


_CONFIGURED: dict[tuple[str, int, str], Any] = {}  # current_limit of rate_limit descriptors


def seconds_until(reset_after_ms: int) -> int:
    """Whole seconds to the window's end, as envoyproxy/ratelimit's CalculateReset:
    `unit - now % unit` in Unix seconds, which is the ceiling of the milliseconds left."""
    return max(1, math.ceil(reset_after_ms / 1000))


def current_limit(
    limit: DescriptorLimit, spec: LimitSpec | None, row: answers.LimitState | None
) -> Any:
    """The configured requests_per_unit and unit, else the reported limit's count and,
    when its window is one unit, that unit."""
    if limit.requests_per_unit is not None and limit.unit is not None:
        # A rate_limit's answer is the same every time: built once (a status copies it,
        # so the one kept here is never changed).
        configured = (limit.name, limit.requests_per_unit, limit.unit)
        out = _CONFIGURED.get(configured)
        if out is None:
            if len(_CONFIGURED) >= 4096:
                _CONFIGURED.clear()
            out = _CONFIGURED[configured] = rls_pb2.RateLimitResponse.RateLimit(
                name=limit.name,
                requests_per_unit=min(limit.requests_per_unit, MAX_UINT32),
                unit=UNIT_ENUM[limit.unit],
            )
        return out
    out = rls_pb2.RateLimitResponse.RateLimit(name=limit.name)
    out.requests_per_unit = min((row.limit if row is not None else None) or 0, MAX_UINT32)
    if spec is not None:
        unit = spec.period if spec.algorithm == "calendar" else _WINDOWS.get(spec.window_ms)
        if unit in UNIT_ENUM and spec.algorithm not in ("token_bucket", "leaky_bucket"):
            out.unit = UNIT_ENUM[unit]
    return out


def _reported(body: answers.Decision) -> int:
    """Which limit of a multi-limit decision a status reports: the first that denied,
    else the one with the fewest remaining."""
    if len(body.limits) == 1:
        return 0
    if body.denied_by:
        return body.denied_by[0]
    counts = [row.remaining if row.remaining is not None else MAX_UINT32 for row in body.limits]
    return counts.index(min(counts))


def _hit_stats(limit: int, before: int | None, hits: int, over: bool, ratio: float) -> list[int]:
    """base_limiter.go's arithmetic: which of `hits` were within, near or over the limit
    (`before` None: the counter was already at or over it)."""
    stats = _hits_only(hits)
    near = math.floor(limit * ratio)
    if over:
        if before is None or before >= limit:
            stats[OVER] = stats[SHADOW] = hits
        else:
            stats[OVER] = stats[SHADOW] = before + hits - limit
            stats[NEAR] = limit - max(near, before)
        return stats
    before = before or 0
    after = before + hits
    if after > near:
        stats[NEAR] = hits if before >= near else after - near
    stats[WITHIN] = hits
    return stats


def checked(
    status: Any,
    limit: DescriptorLimit,
    specs: tuple[LimitSpec, ...],
    body: answers.Decision,
    hits: int,
    settings: EnvoySettings,
    withheld: bool = False,
) -> DescriptorOutcome:
    """A descriptor a node (or on_failure) decided, its answer written into `status` (a
    DescriptorStatus of the response). `withheld`: admitted but not counted
    (another descriptor of the request was over, with
    STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT): OK, with what is left uncounted."""
    index = _reported(body)
    row = body.limits[index]
    configured = row.limit or 0
    remaining = row.remaining or 0
    over = not body.allowed
    if withheld:
        over = False
        if body.rolled_back is not True:  # a rolled-back check shows what is left after it
            remaining = min(remaining + hits, configured)
    counts_denied = bool(specs[index].envoy_flags & COUNTED_DENIALS)
    status.code = OVER_LIMIT if over and not limit.shadow_mode else OK
    status.current_limit.CopyFrom(current_limit(limit, specs[index], row))
    # Upstream reports 0 left when over; with denials consuming nothing the true
    # remaining is meaningful and shown.
    status.limit_remaining = 0 if over and counts_denied else min(remaining, MAX_UINT32)
    if row.reset_after_ms is not None:
        status.duration_until_reset.seconds = seconds_until(row.reset_after_ms)
    if body.degraded:
        stats = _hits_only(hits)
    elif over:
        before = configured - remaining if remaining > 0 else None
        stats = _hit_stats(configured, before, hits, True, settings.near_limit_ratio)
        if body.cached is True:  # answered by the router's denial cache
            stats[OVER_CACHED] = hits
    else:
        before = configured - remaining - hits
        stats = _hit_stats(configured, before, hits, False, settings.near_limit_ratio)
    if not (over and limit.shadow_mode):
        stats[SHADOW] = 0
    return DescriptorOutcome(over, stats)


def blocked(status: Any, limit: DescriptorLimit, hits: int) -> DescriptorOutcome:
    """requests_per_unit: 0: over the limit with any hit, OK for a check-only read
    (written into `status`)."""
    window = ENVOY_UNIT_MS[limit.unit or "second"]
    over = hits > 0
    status.code = OVER_LIMIT if over and not limit.shadow_mode else OK
    status.current_limit.CopyFrom(current_limit(limit, None, None))
    status.duration_until_reset.seconds = seconds_until(window - int(time.time() * 1000) % window)
    stats = _hit_stats(0, 0, hits, over, 0.0)
    if not (over and limit.shadow_mode):
        stats[SHADOW] = 0
    return DescriptorOutcome(over, stats)


def overall(
    statuses: list[Any], quota_modes: list[bool | None], settings: EnvoySettings
) -> tuple[int, Any]:
    """The overall code and the status the RateLimit-* headers describe, as upstream's
    shouldRateLimitWorker: OVER_LIMIT iff a plain descriptor is over, or every quota-mode
    descriptor is (`quota_modes[i]` None for an unlimited descriptor)."""
    failed_plain = failed_quota = total_quota = 0
    least, least_left = None, MAX_UINT32
    for status, quota_mode in zip(statuses, quota_modes, strict=True):
        if status.HasField("current_limit") and status.limit_remaining < least_left:
            least, least_left = status, status.limit_remaining
        if quota_mode is None:
            continue
        is_quota = settings.global_quota_mode or quota_mode
        if status.code == OVER_LIMIT:
            if is_quota:
                failed_quota += 1
            else:
                failed_plain += 1
                least, least_left = status, 0
        if is_quota:
            total_quota += 1
    over = failed_plain > 0 or (total_quota > 0 and total_quota == failed_quota)
    return (OVER_LIMIT if over else OK), least


def add_headers(response: Any, status: Any, settings: EnvoySettings) -> None:
    """LIMIT_RESPONSE_HEADERS_ENABLED: the limit, remaining and reset (seconds) of the
    descriptor closest to its limit."""
    for name, value in (
        (settings.limit_header, status.current_limit.requests_per_unit),
        (settings.remaining_header, status.limit_remaining),
        (settings.reset_header, status.duration_until_reset.seconds),
    ):
        response.response_headers_to_add.add(key=name, value=str(value))
