"""The router's public answers, defined once: the router encodes these Structs, the SDK
decodes them, and the OpenAPI document takes its response schemas from them.

A field that an answer shows only sometimes (an algorithm's extra view fields, the
markers of a shadowed, cached or rolled-back decision) defaults to UNSET and is then
left out of the JSON; every other field is always present, null where it has no value.
Amounts are decimal strings ("49950.50"), never floats.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import UNSET, Meta, UnsetType

Amount = Annotated[str, Meta(description='an exact decimal amount, e.g. "49950.50"')]


class LimitState(msgspec.Struct, kw_only=True):
    """One limit of a decision: what is left after it, and when it resets."""

    algorithm: str
    limit: int | None
    remaining: int | None
    reset_after_ms: int | None
    delay_ms: int | UnsetType | None = UNSET
    max_amount: Amount | UnsetType | None = UNSET
    amount_remaining: Amount | UnsetType | None = UNSET
    period: str | UnsetType = UNSET
    timezone: str | UnsetType = UNSET
    held: Annotated[int | UnsetType, Meta(description="concurrency: leases held now")] = UNSET


class Lease(msgspec.Struct, kw_only=True):
    """A lease of a `concurrency` limit: renew it before `ttl_ms` runs out, release it
    when done (POST /v1/lease/renew, /v1/lease/release). `fencing` grows strictly with
    each lease granted on one rule and key: a protected resource refuses writes carrying
    a lower value than one it has seen."""

    id: Annotated[str, Meta(description="names the lease to renew or release it")]
    fencing: int
    ttl_ms: Annotated[int, Meta(description="the lease expires this long after it was granted")]
    acquired_at_ms: Annotated[
        int | UnsetType, Meta(description="when it was granted: Unix ms on the node's clock")
    ] = UNSET


class ItemProblem(msgspec.Struct, kw_only=True):
    """A batch item refused on its own, as problem+json (RFC 9457) would say it: e.g. a
    request_id reused for a different request (`request-id-reused`, 409)."""

    type: str
    title: str
    status: int
    detail: str


class Decision(msgspec.Struct, kw_only=True):
    """The answer to a check: 200 when allowed, 429 when denied, the same body both ways."""

    allowed: bool
    key: str
    rule: str | None
    node: str
    retry_after_ms: int | None
    limits: list[LimitState]
    denied_by: list[int]
    replayed: bool = False
    dry_run: bool = False
    degraded: bool = False
    degraded_reason: str | UnsetType = UNSET
    rolled_back: bool | UnsetType = UNSET
    rollback_failed: bool | UnsetType = UNSET
    shadow: Annotated[
        bool | UnsetType,
        Meta(description="the rule is in shadow mode and denied: answered as allowed"),
    ] = UNSET
    cached: Annotated[
        bool | UnsetType,
        Meta(description="answered by the router's denial cache (`cache_denials`)"),
    ] = UNSET
    problem: Annotated[
        ItemProblem | UnsetType,
        Meta(description="in a batch: this check was refused on its own, nothing consumed"),
    ] = UNSET
    lease: Annotated[
        Lease | UnsetType,
        Meta(description="the lease an allowed check of a `concurrency` limit acquired"),
    ] = UNSET


class BatchResult(msgspec.Struct, kw_only=True):
    """The answer to a batch: one decision per check, in order."""

    allowed: bool
    results: list[Decision]


class GivenBack(msgspec.Struct, kw_only=True):
    """What a refund returned to one limit (`amount` for limits that count money)."""

    algorithm: str
    count: int
    amount: Amount | UnsetType = UNSET


class RefundResult(msgspec.Struct, kw_only=True):
    """The answer to a refund; `refunded` is false when the decision consumed nothing."""

    refunded: bool
    key: str
    rule: str | None
    request_id: str
    given_back: list[GivenBack]
    detail: str | None


class QuotaAdjusted(msgspec.Struct, kw_only=True):
    """The answer to a quota adjustment: the quota after it."""

    key: str
    rule: str
    request_id: str
    replayed: bool
    limit: int | None
    remaining: int | None
    max_amount: Amount | None
    amount_remaining: Amount | None
    reset_after_ms: int | None


class LeaseRenewed(msgspec.Struct, kw_only=True):
    """The answer to a lease renewal: it now expires `lease.ttl_ms` after `renewed_at_ms`."""

    key: str
    rule: str
    lease: Lease
    renewed_at_ms: Annotated[int, Meta(description="Unix ms on the node's clock")]


class LeaseReleased(msgspec.Struct, kw_only=True):
    """The answer to a lease release: its slot is free from `released_at_ms` on."""

    key: str
    rule: str
    lease_id: str
    fencing: int
    released: bool
    released_at_ms: Annotated[int, Meta(description="Unix ms on the node's clock")]


ANSWERS: tuple[type[msgspec.Struct], ...] = (
    LimitState,
    ItemProblem,
    Decision,
    BatchResult,
    GivenBack,
    RefundResult,
    QuotaAdjusted,
    Lease,
    LeaseRenewed,
    LeaseReleased,
)
