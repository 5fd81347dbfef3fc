"""The router's local over-limit cache, for rules with `cache_denials: true`.

When a check is denied because one of its limits is used up (nothing left, not merely
too little for this cost), every later check that consumes from that limit is denied
too until quota comes back. The router remembers that instant and answers such checks
itself, without a node call, as envoyproxy/ratelimit's local cache does.

Exact except for one thing, documented: a refund or restock made meanwhile through
*another* router takes effect for this one only at the remembered instant (a refund or
restock through this router forgets the key at once). Never cached: checks with a
`request_id` (a retry must get its first decision back, which may have been allowed),
reads (`cost: 0` with no amount), and limits whose quota returns at an instant the
denial does not tell exactly (token/leaky buckets and sliding windows denied a cost
above 1: their `retry_after_ms` is the wait for that cost, later than for one unit).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from cluster.model import answers
from cluster.model.limits import LimitSpec
from cluster.wire import LimitRow
from router.requests import CheckRequest
from router.rules.book import Rule

__all__ = ["DenialCache"]

_WINDOW_RESETS = frozenset({"fixed_window", "calendar"})
# Quota comes back to a used-up `quota` limit only by refund or restock; a cached
# denial of one is re-asked after this long, so other routers' restocks show up.
QUOTA_RECHECK_MS = 1_000


@dataclass(slots=True)
class _Entry:
    rule: Rule  # the rule the denial was decided under: a changed rule forgets it
    count_until: float  # monotonic seconds; checks with cost > 0 are denied before it
    amount_until: float  # the same for checks with an amount > 0
    body: answers.Decision  # the denial, answered again with its times brought forward
    at: float


def _returns_after_ms(spec: LimitSpec, row: LimitRow, cost: int) -> int | None:
    """How long until a used-up limit admits a unit again, when the row says exactly."""
    if spec.algorithm == "quota":
        expires = row.reset_after_ms
        return QUOTA_RECHECK_MS if expires < 0 else min(expires, QUOTA_RECHECK_MS) or None
    if spec.algorithm in _WINDOW_RESETS:
        return row.reset_after_ms if row.reset_after_ms > 0 else None
    if cost == 1 and row.retry_after_ms > 0:
        return row.retry_after_ms
    return None


class DenialCache:
    def __init__(
        self, max_entries: int = 100_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._max_entries = max_entries
        self._clock = clock

    def answer(self, request: CheckRequest) -> answers.Decision | None:
        """The remembered denial for this check, its times brought forward; None when
        the check must go to its node."""
        if request.request_id is not None or not self._entries:
            return None
        rule, key = request.rule, request.key
        entry = self._entries.get((rule.name, key))
        if entry is None:
            return None
        now = self._clock()
        if entry.rule != rule or (now >= entry.count_until and now >= entry.amount_until):
            del self._entries[(rule.name, key)]
            return None
        blocked = (request.cost > 0 and now < entry.count_until) or (
            any(a > 0 for a in request.amounts) and now < entry.amount_until
        )
        if not blocked:
            return None
        return _brought_forward(entry.body, int((now - entry.at) * 1000), request.dry_run)

    def remember(
        self, request: CheckRequest, rows: Sequence[LimitRow], body: answers.Decision
    ) -> None:
        """Note a denial if it used up a limit; `body` is its public decision."""
        cost, amounts = request.cost, request.amounts
        count_ms = amount_ms = 0
        for i, (spec, row) in enumerate(zip(request.rule.limits, rows, strict=True)):
            if row.ok:
                continue
            wait = _returns_after_ms(spec, row, cost)
            if wait is None:
                continue
            if cost > 0 and row.remaining == 0:
                count_ms = max(count_ms, wait)
            amount = amounts[i] if i < len(amounts) else 0
            if amount > 0 and row.amount_remaining == 0:  # NONE (-1) without max_amount
                amount_ms = max(amount_ms, wait)
        if not count_ms and not amount_ms:
            return
        now = self._clock()
        if len(self._entries) >= self._max_entries:
            self._evict(now)
        self._entries[(request.rule.name, request.key)] = _Entry(
            request.rule, now + count_ms / 1000, now + amount_ms / 1000, body, now
        )

    def forget(self, rule_name: str, key: str) -> None:
        """A refund or restock through this router: ask the node again."""
        self._entries.pop((rule_name, key), None)

    def _evict(self, now: float) -> None:
        expired = [
            k for k, e in self._entries.items() if now >= e.count_until and now >= e.amount_until
        ]
        for k in expired:
            del self._entries[k]
        while len(self._entries) >= self._max_entries:
            del self._entries[next(iter(self._entries))]  # the oldest


def _brought_forward(body: answers.Decision, elapsed_ms: int, dry_run: bool) -> answers.Decision:
    retry = body.retry_after_ms
    limits = [
        msgspec.structs.replace(view, reset_after_ms=max(0, view.reset_after_ms - elapsed_ms))
        if view.reset_after_ms is not None and view.reset_after_ms > 0
        else view
        for view in body.limits
    ]
    return msgspec.structs.replace(
        body,
        cached=True,
        dry_run=dry_run,
        replayed=False,
        retry_after_ms=None if retry is None else max(0, retry - elapsed_ms),
        limits=limits,
    )
