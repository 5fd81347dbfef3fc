"""The lease calls of both clients (POST /v1/lease/renew, /v1/lease/release) as `_Call`s,
their results, and what `client.lease(...)` shares between its asyncio and blocking
forms: how long to wait before checking again, and when to renew."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import msgspec

from cluster.model import answers
from cluster.sdk.calls import _Call, _json
from cluster.sdk.decisions import Decision, LeaseGrant
from cluster.sdk.errors import Unavailable

__all__ = [
    "LeaseRelease",
    "LeaseRenewal",
    "backoff_s",
    "granted",
    "release_call",
    "renew_call",
    "renew_every_s",
]

FIRST_BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0


@dataclass(frozen=True, slots=True)
class LeaseRenewal:
    """A renewed lease: it now expires `ttl_ms` after `renewed_at_ms` (node clock)."""

    key: str
    rule: str
    lease_id: str
    fencing: int
    ttl_ms: int
    renewed_at_ms: int


@dataclass(frozen=True, slots=True)
class LeaseRelease:
    """A released lease: its slot is free from `released_at_ms` (node clock) on."""

    key: str
    rule: str
    lease_id: str
    fencing: int
    released_at_ms: int


def _renewal(data: dict[str, Any]) -> LeaseRenewal:
    body = msgspec.convert(data, answers.LeaseRenewed)
    lease = body.lease
    return LeaseRenewal(
        body.key, body.rule, lease.id, lease.fencing, lease.ttl_ms, body.renewed_at_ms
    )


def _release(data: dict[str, Any]) -> LeaseRelease:
    body = msgspec.convert(data, answers.LeaseReleased)
    return LeaseRelease(body.key, body.rule, body.lease_id, body.fencing, body.released_at_ms)


def renew_call(key: str, rule: str, lease_id: str, ttl: str | int | None) -> _Call[LeaseRenewal]:
    body: dict[str, Any] = {"key": key, "rule": rule, "lease_id": lease_id}
    if ttl is not None:
        body["ttl"] = ttl
    return _Call("POST", "/v1/lease/renew", _json(body), _renewal)


def release_call(key: str, rule: str, lease_id: str) -> _Call[LeaseRelease]:
    body = {"key": key, "rule": rule, "lease_id": lease_id}
    return _Call("POST", "/v1/lease/release", _json(body), _release)


def granted(decision: Decision) -> LeaseGrant | None:
    """The decision's lease; None when it was denied. Raises Unavailable for a degraded
    decision allowed without a lease (`on_failure: allow`: it acquired nothing), and
    ValueError for a rule that grants no lease (no concurrency limit, or a shadow rule's
    denial)."""
    if not decision.allowed:
        return None
    if decision.lease is None:
        if decision.degraded or decision.dry_run:
            raise Unavailable(f"allowed without a lease ({decision.degraded_reason})")
        raise ValueError(
            f"rule {decision.rule!r} allowed without a lease: it has no concurrency limit, "
            "or it is in shadow mode and denied"
        )
    return decision.lease


def backoff_s(attempt: int, decision: Decision, left_s: float) -> float:
    """How long to wait before checking again after `attempt` denials: exponential from
    50 ms up to 1 s with jitter, never past the earliest held lease's expiry (the
    decision's retry_after_ms, when a release frees no slot sooner) nor the wait left."""
    wait = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2.0 ** min(attempt, 10)) * random.uniform(0.5, 1)
    if decision.retry_after_ms is not None:
        wait = min(wait, decision.retry_after_ms / 1000)
    return max(0.0, min(wait, left_s))


def renew_every_s(ttl_ms: int) -> float:
    """The watchdog renews at a third of the lease's time to live."""
    return ttl_ms / 3000
