"""`async with client.lease("exports", key=tenant) as lease:`: hold a lease of a
`concurrency` limit while the body runs.

- On entry it acquires the lease (a check of the rule). Denied, it raises RateLimited at
  once, or with `wait=` seconds checks again until a slot frees or the wait is over
  (backoff from 50 ms to 1 s, never past the decision's retry_after_ms).
- A watchdog task renews it every third of its TTL while the body runs.
- On exit (an exception included) it releases the lease.
- If the lease is lost meanwhile (a renewal finds it no longer held, or no renewal gets
  through before it runs out), `lease.lost` (an asyncio.Event) is set at once, for a body
  that awaits it or checks it (`lease.check()` raises LeaseLost), and the exit raises
  LeaseLost, unless the body raised an exception of its own, which goes on unchanged.
  `lease.fencing` is the value to hand to the resource the lease protects.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from typing import Protocol

from cluster.sdk.decisions import Decision, LeaseGrant
from cluster.sdk.errors import (
    LeaseLost,
    LeaseNotHeld,
    RateLimited,
    ShardlimitError,
    Unavailable,
)
from cluster.sdk.lease_calls import LeaseRelease, LeaseRenewal, backoff_s, granted, renew_every_s

__all__ = ["AsyncLease"]

MIN_RETRY_S = 0.05


class _Leasing(Protocol):
    async def check(self, key: str, rule: str | None = None) -> Decision: ...
    async def renew_lease(
        self, key: str, rule: str, lease_id: str, *, ttl: str | int | None = None
    ) -> LeaseRenewal: ...
    async def release_lease(self, key: str, rule: str, lease_id: str) -> LeaseRelease: ...


class AsyncLease:
    """A lease held for the length of an `async with` block (module docstring)."""

    def __init__(
        self,
        client: _Leasing,
        rule: str,
        key: str,
        *,
        wait: float | None = None,
        ttl: str | int | None = None,
    ) -> None:
        self._client = client
        self.rule = rule
        self.key = key
        self._wait = wait
        self._ttl = ttl
        self.grant: LeaseGrant | None = None
        self.lost = asyncio.Event()
        self.lost_why: str | None = None
        self.released: LeaseRelease | None = None
        self.renewals = 0  # renewals that got through
        self._expires = 0.0  # loop time by which the lease surely ran out unless renewed
        self._watchdog: asyncio.Task[None] | None = None

    @property
    def id(self) -> str:
        return self._held().id

    @property
    def fencing(self) -> int:
        return self._held().fencing

    @property
    def ttl_ms(self) -> int:
        return self._held().ttl_ms

    def check(self) -> None:
        """Raise LeaseLost if the lease was lost (before a write it protects)."""
        if self.lost.is_set():
            grant = self._held()
            raise LeaseLost(grant.id, grant.fencing, self.lost_why or "lost")

    async def __aenter__(self) -> AsyncLease:
        loop = asyncio.get_running_loop()
        deadline = None if self._wait is None else loop.time() + self._wait
        attempt = 0
        while True:
            sent = loop.time()
            decision = await self._client.check(self.key, self.rule)
            grant = granted(decision)
            if grant is not None:
                break
            left = 0.0 if deadline is None else deadline - loop.time()
            if left <= 0:
                raise RateLimited(decision)
            await asyncio.sleep(backoff_s(attempt, decision, left))
            attempt += 1
        self.grant, self._expires = grant, sent + grant.ttl_ms / 1000
        if self._ttl is not None:  # a lease of its own length from the start
            try:
                await self._renew_now()
            except BaseException:
                with contextlib.suppress(ShardlimitError):
                    await self._client.release_lease(self.key, self.rule, grant.id)
                raise
        self._watchdog = loop.create_task(self._renew_while_held())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        grant = self._held()
        if not self.lost.is_set():
            try:
                self.released = await self._client.release_lease(self.key, self.rule, grant.id)
            except LeaseNotHeld:
                self._lose("it was no longer held when released")
            except ShardlimitError:
                pass  # the router is unreachable: the lease runs out by itself
        if self.lost.is_set() and exc is None:
            raise LeaseLost(grant.id, grant.fencing, self.lost_why or "lost")

    def _held(self) -> LeaseGrant:
        if self.grant is None:
            raise RuntimeError("the lease is acquired on entering `async with`")
        return self.grant

    def _lose(self, why: str) -> None:
        if not self.lost.is_set():
            self.lost_why = why
            self.lost.set()

    async def _renew_now(self) -> bool:
        """One renewal; False once the lease is lost. Raises Unavailable."""
        loop = asyncio.get_running_loop()
        sent = loop.time()
        try:
            renewal = await self._client.renew_lease(
                self.key, self.rule, self._held().id, ttl=self._ttl
            )
        except LeaseNotHeld:
            self._lose("a renewal found it no longer held")
            return False
        self._expires = sent + renewal.ttl_ms / 1000
        self.grant = LeaseGrant(renewal.lease_id, renewal.fencing, renewal.ttl_ms)
        self.renewals += 1
        return True

    async def _renew_while_held(self) -> None:
        loop = asyncio.get_running_loop()
        pause = renew_every_s(self._held().ttl_ms)
        while True:
            await asyncio.sleep(pause)
            try:
                if not await self._renew_now():
                    return
                pause = renew_every_s(self._held().ttl_ms)
            except Unavailable:
                left = self._expires - loop.time()
                if left <= 0:
                    self._lose("no renewal got through before it ran out")
                    return
                pause = max(MIN_RETRY_S, min(pause, left / 4))
            except ShardlimitError as exc:  # e.g. the rule is gone: 400
                self._lose(f"a renewal was refused: {exc}")
                return
