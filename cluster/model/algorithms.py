"""One record per algorithm: its public name, its number in Lua, its Lua file, how
its parameters are packed for the scripts, and which extra fields its decision shows.

Everything that must agree about an algorithm reads it from here: the scripts the node
assembles (node/store/scripts.py), the node's argument packing (node/store/limit_args.py),
the router's decision bodies. A Lua file registers itself as `ALG[<code>]` with the code
given here. The limit model (cluster/model/limits.py) holds each algorithm's API
parameters, and this module checks on import that both name the same algorithms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cluster.model import limits
from cluster.model.calendar import boundaries, load_timezone
from cluster.model.limits import LimitSpec

__all__ = [
    "ALGORITHMS",
    "BY_CODE",
    "BY_NAME",
    "DEFAULT_QUOTA_TTL_MS",
    "LEASE_NONCE_PARAM",
    "NONE",
    "Algorithm",
]

NONE = -1  # "no value" in script arguments and replies
DEFAULT_QUOTA_TTL_MS = 400 * 86_400_000
# spec, the node's estimate of its Redis' clock (ms), the quota TTL the router sent (ms)
# -> the six script parameters p1..p6
Pack = Callable[["LimitSpec", int, int], list[int]]


def _windowed(spec: LimitSpec, _now_ms: int, _quota_ttl_ms: int) -> list[int]:
    return [spec.limit or 0, spec.window_ms, spec.envoy_flags, 0, 0, 0]


def _bucket(spec: LimitSpec, _now_ms: int, _quota_ttl_ms: int) -> list[int]:
    return [spec.rate, spec.window_ms, spec.limit or 0, 0, 0, 0]


def _quota(spec: LimitSpec, _now_ms: int, quota_ttl_ms: int) -> list[int]:
    # No window: count and amount limits, the end (Unix ms) or -1, the idle lifetime.
    count = NONE if spec.limit is None else spec.limit
    amount = NONE if spec.max_amount is None else spec.max_amount
    expires = NONE if spec.expires_at_ms is None else spec.expires_at_ms
    return [count, amount, expires, quota_ttl_ms or DEFAULT_QUOTA_TTL_MS, 0, 0]


# concurrency: where the node puts each check's fresh lease nonce among p1..p6 (p4).
LEASE_NONCE_PARAM = 3


def _concurrency(spec: LimitSpec, _now_ms: int, quota_ttl_ms: int) -> list[int]:
    # The lease, and how long the key (its fencing counter) lives after its last grant or
    # renewal: the quota TTL, at least the lease. p4 (the nonce) is set per check.
    keep_ms = max(quota_ttl_ms or DEFAULT_QUOTA_TTL_MS, spec.window_ms)
    return [spec.limit or 0, spec.window_ms, keep_ms, 0, 0, 0]


def _calendar(spec: LimitSpec, now_ms: int, _quota_ttl_ms: int) -> list[int]:
    # Four consecutive natural-period starts around now: the script picks the one that
    # holds its Redis' clock (and asks for a re-measure if none does).
    starts = boundaries(spec.period, load_timezone(spec.timezone), now_ms)
    count = NONE if spec.limit is None else spec.limit
    amount = NONE if spec.max_amount is None else spec.max_amount
    return [count, amount, *starts]


@dataclass(frozen=True)
class Algorithm:
    name: str
    code: int  # ALG[code] in node/store/lua
    lua_file: str
    pack: Pack
    view_fields: tuple[str, ...] = ()  # decision fields beyond limit/remaining/reset


ALGORITHMS: tuple[Algorithm, ...] = (
    Algorithm("fixed_window", 1, "fixed_window.lua", _windowed),
    Algorithm("sliding_log", 2, "sliding_log.lua", _windowed),
    Algorithm("sliding_window", 3, "sliding_window.lua", _windowed),
    Algorithm("token_bucket", 4, "token_bucket.lua", _bucket),
    Algorithm("leaky_bucket", 5, "leaky_bucket.lua", _bucket, ("delay_ms",)),
    Algorithm(
        "calendar",
        6,
        "calendar.lua",
        _calendar,
        ("period", "timezone", "max_amount", "amount_remaining"),
    ),
    Algorithm("quota", 7, "quota.lua", _quota, ("max_amount", "amount_remaining")),
    # Its node row differs (node/store/lua/concurrency.lua): the router reads it by name.
    Algorithm("concurrency", 8, "concurrency.lua", _concurrency, ("held",)),
)
BY_NAME = {algorithm.name: algorithm for algorithm in ALGORITHMS}
BY_CODE = {algorithm.code: algorithm for algorithm in ALGORITHMS}
# The limit model reads the parameters of exactly these algorithms, in this order.
assert tuple(BY_NAME) == limits.ALGORITHMS, (tuple(BY_NAME), limits.ALGORITHMS)
