"""Operations a router sends to a node, parsed and checked at the node boundary."""

from __future__ import annotations

from typing import Any, Final

import msgspec

from cluster.model.keys import INLINE_SCOPE, MAX_KEY_BYTES, REQUEST_ID, RULE_NAME
from cluster.model.lease_ids import NONCE_BITS
from cluster.model.limits import MAX_DURATION_MS, MAX_LEASE_MS, LimitSpec
from cluster.wire import Op as WireOp
from cluster.wire import OpKind
from node.errors import BadOp

MAX_TTL_MS = 30 * 86_400_000
MAX_HOLD_MS = 600_000
MAX_ADJUST = 10**15  # counts and minor units stay exact in Lua doubles
# The kinds as module constants: a global name is cheaper to reach than an enum attribute.
CHECK: Final = OpKind.CHECK
REFUND: Final = OpKind.REFUND
COMMIT: Final = OpKind.COMMIT
UNDO: Final = OpKind.UNDO
ADJUST: Final = OpKind.ADJUST
_LEASE_KINDS: Final = frozenset({OpKind.RENEW, OpKind.RELEASE})
_FENCING_END: Final = 2**53  # fencing values and nonces stay exact in Lua doubles
_NONCE_END: Final = 2**NONCE_BITS
# A wire op's kind (a plain str) -> its member; one lookup validates it too.
_KINDS: Final[dict[str, OpKind]] = {kind.value: kind for kind in OpKind}


class Op(msgspec.Struct, frozen=True):  # a Struct: built once per op, ~10x cheaper
    kind: OpKind  # the member itself: compared by identity (`op.kind is CHECK`)
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
    undo: bytes | None = None  # kind "undo": the undo entries of the check to take back
    quota_ttl_ms: int = 0  # quota limits: lifetime from last change (0: the default)
    adjust: tuple[int, int, int, int] | None = None  # kind "adjust" (cluster/wire/batch.py)
    fingerprint: str = ""  # a check's request fingerprint ("": none, replays unchecked)
    durable: bool = False  # acknowledged only once a replica holds it (cluster/wire/batch.py)
    lease: tuple[int, int, int] | None = None  # kind "renew" / "release" (cluster/wire/batch.py)


_encoder = msgspec.msgpack.Encoder()
# Rules repeat: each distinct wire form of a list of limits is validated once. The key is
# that list's msgpack form: exact to the type (True, 1 and 1.0 differ) and cheap to make.
_limits_cache: dict[bytes, tuple[LimitSpec, ...]] = {}
_LIMITS_CACHE_MAX = 10_000
# Scopes repeat as well (rule names): each one matched once.
_scopes: set[str] = {INLINE_SCOPE}
_SCOPES_MAX = 10_000


def _limit(wire: Any) -> LimitSpec:
    try:
        return LimitSpec.from_wire(wire)
    except (ValueError, TypeError) as exc:
        raise BadOp(f"bad limit: {exc}") from exc


def _limits(wire: list[list[Any]]) -> tuple[LimitSpec, ...]:
    """The validated specs (the same tuple for the same wire form: node/store/counter_store.py keys
    what it works out per rule by it)."""
    cache_key = _encoder.encode(wire)
    specs = _limits_cache.get(cache_key)
    if specs is None:
        if not wire or len(wire) > 16:
            raise BadOp("limits must be a list of 1..16 limits")
        specs = tuple(_limit(w) for w in wire)
        if len(_limits_cache) >= _LIMITS_CACHE_MAX:
            _limits_cache.clear()
        _limits_cache[cache_key] = specs
    return specs


def _valid_scope(scope: str) -> bool:
    if scope in _scopes:
        return True
    if not RULE_NAME.match(scope):
        return False
    if len(_scopes) >= _SCOPES_MAX:
        _scopes.clear()
        _scopes.add(INLINE_SCOPE)
    _scopes.add(scope)
    return True


def parse_op(wire: WireOp) -> Op:
    """A decoded wire op (types already checked by msgspec) -> a validated Op."""
    kind = _KINDS.get(wire.kind)
    if kind is None:
        raise BadOp(
            "op must be 'check', 'refund', 'commit', 'undo', 'adjust', 'renew' or 'release'"
        )
    if (kind is UNDO) != (wire.undo is not None):
        raise BadOp("an undo op, and only an undo op, carries undo entries")
    key = wire.key
    # At most 4 bytes per character: short keys need no encoding to be measured.
    if not key or (len(key) * 4 > MAX_KEY_BYTES and len(key.encode()) > MAX_KEY_BYTES):
        raise BadOp("key must be a non-empty string of at most 512 bytes")
    scope = wire.scope
    if not _valid_scope(scope):
        raise BadOp("bad scope")
    limits = _limits(wire.limits)
    if len(wire.amounts) != len(limits):
        raise BadOp("amounts must hold one non-negative integer per limit")
    request_id = wire.request_id
    if request_id is not None and not REQUEST_ID.match(request_id):
        raise BadOp("bad request_id")
    if wire.record_ttl_ms > MAX_TTL_MS:
        raise BadOp("record_ttl_ms too large")
    if wire.quota_ttl_ms > MAX_DURATION_MS:
        raise BadOp("quota_ttl_ms too large")
    if request_id is None and (kind is REFUND or kind is COMMIT):
        raise BadOp(f"{wire.kind} needs a request_id")
    if wire.hold_ms > MAX_HOLD_MS:
        raise BadOp(f"hold_ms must be at most {MAX_HOLD_MS}")
    batch, coordinator = wire.batch, wire.coordinator
    if (batch is None) != (coordinator is None):
        raise BadOp("batch and coordinator go together")
    if batch is not None and not (
        REQUEST_ID.match(batch) and coordinator is not None and RULE_NAME.match(coordinator)
    ):
        raise BadOp("bad batch or coordinator")
    return Op(
        kind,
        key,
        scope,
        limits,
        tuple(wire.amounts),
        wire.cost,
        request_id,
        wire.dry_run,
        wire.void,
        wire.record_ttl_ms,
        wire.hold_ms,
        batch,
        coordinator,
        wire.undo,
        wire.quota_ttl_ms,
        _adjust(wire, kind) if wire.adjust is not None or kind is ADJUST else None,
        _fingerprint(wire) if wire.fingerprint is not None else "",
        wire.durable,
        _lease(wire, kind) if wire.lease is not None or kind in _LEASE_KINDS else None,
    )


def _fingerprint(wire: WireOp) -> str:
    value = wire.fingerprint
    if value is None:
        return ""
    if not 1 <= len(value) <= 64 or not value.isalnum() or not value.isascii():
        raise BadOp("fingerprint must be 1-64 ASCII letters and digits")
    return value


def _adjust(wire: WireOp, kind: OpKind) -> tuple[int, int, int, int] | None:
    if (kind is ADJUST) != (wire.adjust is not None):
        raise BadOp("an adjust op, and only an adjust op, carries an adjustment")
    if wire.adjust is None:
        return None
    if len(wire.adjust) != 4 or not all(isinstance(v, int) for v in wire.adjust):
        raise BadOp("adjust must be [count_mode, count, amount_mode, amount]")
    count_mode, count, amount_mode, amount = wire.adjust
    if count_mode not in (0, 1, 2) or amount_mode not in (0, 1, 2) or count_mode + amount_mode == 0:
        raise BadOp("adjust modes are 0 (none), 1 (delta), 2 (set); one at least")
    if max(abs(count), abs(amount)) > MAX_ADJUST:
        raise BadOp(f"adjust values must be at most {MAX_ADJUST} in size")
    if wire.request_id is None or len(wire.limits) != 1 or wire.limits[0][0] != "quota":
        raise BadOp("adjust needs a request_id and exactly one quota limit")
    return (count_mode, count, amount_mode, amount)


def _lease(wire: WireOp, kind: OpKind) -> tuple[int, int, int] | None:
    lease = wire.lease
    if (kind in _LEASE_KINDS) != (lease is not None):
        raise BadOp("a renew or release op, and only one, carries a lease")
    if lease is None:
        return None
    if len(lease) != 3:
        raise BadOp("lease must be [fencing, nonce, ttl_ms]")
    fencing, nonce, ttl_ms = lease
    if not (isinstance(fencing, int) and isinstance(nonce, int) and isinstance(ttl_ms, int)):
        raise BadOp("lease must be [fencing, nonce, ttl_ms]")
    if not (0 < fencing < _FENCING_END and 0 <= nonce < _NONCE_END and 0 <= ttl_ms <= MAX_LEASE_MS):
        raise BadOp(f"lease fencing, nonce or ttl_ms out of range (ttl_ms <= {MAX_LEASE_MS})")
    limits = wire.limits
    if len(limits) != 1 or limits[0][0] != "concurrency":
        raise BadOp("renew and release need exactly one concurrency limit")
    return (fencing, nonce, ttl_ms)
