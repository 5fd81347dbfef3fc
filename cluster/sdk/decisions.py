"""What a check answers: a `Decision` and the state of each of its limits."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal


@dataclass(frozen=True, slots=True)
class LimitState:
    """One limit of a decision. Amount fields are set only for calendar limits."""

    algorithm: str
    limit: int | None
    remaining: int | None
    reset_after_ms: int | None
    delay_ms: int | None = None
    max_amount: Decimal | None = None
    amount_remaining: Decimal | None = None
    period: str | None = None
    timezone: str | None = None
    held: int | None = None  # concurrency: leases held now


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    """The lease an allowed check of a `concurrency` limit acquired: renew it before
    `ttl_ms` runs out, release it when done. `fencing` grows strictly with each lease
    granted on one rule and key: pass it to the resource the lease protects, which
    refuses writes carrying a lower value than one it has seen."""

    id: str
    fencing: int
    ttl_ms: int
    acquired_at_ms: int | None = None  # Unix ms on the node's clock


@dataclass(frozen=True, slots=True)
class Decision:
    """The router's answer to a check (a 429 is a Decision with `allowed=False`)."""

    allowed: bool
    key: str
    rule: str | None
    node: str
    retry_after_ms: int | None
    limits: tuple[LimitState, ...]
    denied_by: tuple[int, ...] = ()
    replayed: bool = False
    dry_run: bool = False
    degraded: bool = False
    rolled_back: bool = False
    rollback_failed: bool = False
    degraded_reason: str | None = None
    lease: LeaseGrant | None = None  # a concurrency limit's, when the check acquired one
