"""Operations a router sends to a node, parsed and checked at the node boundary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cluster.keys import INLINE_SCOPE, MAX_KEY_BYTES, REQUEST_ID, RULE_NAME
from cluster.limits import LimitSpec

MAX_TTL_MS = 30 * 86_400_000
MAX_HOLD_MS = 600_000


class BadOp(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Op:
    kind: str  # "check" or "refund"
    key: str
    scope: str
    limits: tuple[LimitSpec, ...]
    amounts: tuple[int, ...]
    cost: int = 0
    request_id: str | None = None
    dry_run: bool = False
    void: bool = False
    record_ttl_ms: int = 0
    hold_ms: int = 0  # all-or-nothing first phase: given back unless committed in time
    # A held check's batch id and the node holding that batch's commit/abort decision.
    batch: str | None = None
    coordinator: str | None = None


_limit_cache: dict[str, LimitSpec] = {}


def _limit(wire: Any) -> LimitSpec:
    # Rules repeat: validate each distinct wire form once.
    cache_key = repr(wire)
    spec = _limit_cache.get(cache_key)
    if spec is None:
        try:
            spec = LimitSpec.from_wire(wire)
        except (ValueError, TypeError) as exc:
            raise BadOp(f"bad limit: {exc}") from exc
        if len(_limit_cache) > 10_000:
            _limit_cache.clear()
        _limit_cache[cache_key] = spec
    return spec


def _int(data: dict[str, Any], name: str, default: int = 0) -> int:
    value = data.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadOp(f"{name} must be a non-negative integer")
    return value


def parse_op(data: Any) -> Op:
    if not isinstance(data, dict):
        raise BadOp("op must be an object")
    kind = data.get("op")
    if kind not in ("check", "refund", "commit"):
        raise BadOp("op must be 'check', 'refund' or 'commit'")
    key = data.get("key")
    if not isinstance(key, str) or not key or len(key.encode()) > MAX_KEY_BYTES:
        raise BadOp("key must be a non-empty string of at most 512 bytes")
    scope = data.get("scope")
    if not isinstance(scope, str) or not (scope == INLINE_SCOPE or RULE_NAME.match(scope)):
        raise BadOp("bad scope")
    raw_limits = data.get("limits")
    if not isinstance(raw_limits, list) or not raw_limits or len(raw_limits) > 16:
        raise BadOp("limits must be a list of 1..16 limits")
    limits = tuple(_limit(w) for w in raw_limits)
    amounts = data.get("amounts", [0] * len(limits))
    if (
        not isinstance(amounts, list)
        or len(amounts) != len(limits)
        or not all(isinstance(a, int) and not isinstance(a, bool) and a >= 0 for a in amounts)
    ):
        raise BadOp("amounts must hold one non-negative integer per limit")
    request_id = data.get("request_id")
    if request_id is not None and not (
        isinstance(request_id, str) and REQUEST_ID.match(request_id)
    ):
        raise BadOp("bad request_id")
    ttl = _int(data, "record_ttl_ms")
    if ttl > MAX_TTL_MS:
        raise BadOp("record_ttl_ms too large")
    if kind != "check" and request_id is None:
        raise BadOp(f"{kind} needs a request_id")
    hold = _int(data, "hold_ms")
    if hold > MAX_HOLD_MS:
        raise BadOp(f"hold_ms must be at most {MAX_HOLD_MS}")
    batch, coordinator = data.get("batch"), data.get("coordinator")
    if (batch is None) != (coordinator is None):
        raise BadOp("batch and coordinator go together")
    if batch is not None and not (
        isinstance(batch, str)
        and REQUEST_ID.match(batch)
        and isinstance(coordinator, str)
        and RULE_NAME.match(coordinator)
    ):
        raise BadOp("bad batch or coordinator")
    return Op(
        kind=kind,
        key=key,
        scope=scope,
        limits=limits,
        amounts=tuple(amounts),
        cost=_int(data, "cost"),
        request_id=request_id,
        dry_run=bool(data.get("dry_run", False)),
        void=bool(data.get("void", False)),
        record_ttl_ms=ttl,
        hold_ms=hold,
        batch=batch,
        coordinator=coordinator,
    )
