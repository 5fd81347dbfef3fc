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
