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

from cluster.sdk.decisions import Decision
from cluster.sdk.errors import LeaseNotHeld, RateLimited, ShardlimitError, Unavailable
from cluster.sdk.lease_calls import LeaseRelease, LeaseRenewal, backoff_s, granted, renew_every_s
from cluster.sdk.lease_state import LeaseState

__all__ = ["AsyncLease"]


class _Leasing(Protocol):
    async def check(self, key: str, rule: str | None = None) -> Decision: ...
    async def renew_lease(
        self, key: str, rule: str, lease_id: str, *, ttl: str | int | None = None
    ) -> LeaseRenewal: ...
    async def release_lease(self, key: str, rule: str, lease_id: str) -> LeaseRelease: ...


class AsyncLease(LeaseState):
    """A lease held for the length of an `async with` block (module docstring)."""

    entered_by = "async with"
    lost: asyncio.Event

    def __init__(
        self,
        client: _Leasing,
        rule: str,
        key: str,
        *,
        wait: float | None = None,
        ttl: str | int | None = None,
    ) -> None:
        super().__init__(rule, key, wait=wait, ttl=ttl, lost=asyncio.Event())
        self._client = client
        self._watchdog: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None  # fires when the lease runs out

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
        self._acquired(grant, sent)
        self._arm()
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
        if self._timer is not None:
            self._timer.cancel()
        if not self.lost.is_set():
            await self._release()
        self._raise_if_lost(exc)

    async def _release(self) -> None:
        """Release the lease; sent again while the router or node is unavailable (the
        node restarting, a failover), within RELEASE_PATIENCE_S and the lease's life."""
        loop = asyncio.get_running_loop()
        grant, started, attempt = self._held(), loop.time(), 0
        while True:
            try:
                self.released = await self._client.release_lease(self.key, self.rule, grant.id)
                return
            except LeaseNotHeld:
                if attempt == 0:
                    self._lose("it was no longer held when released")
                return  # after an unanswered try, that try may have freed it
            except Unavailable as exc:
                pause = self._release_retry_in(loop.time(), started, attempt)
                if pause is None:
                    self._unreleased(exc)
                    return
                await asyncio.sleep(pause)  # retry cadence
                attempt += 1
            except ShardlimitError as exc:  # refused, e.g. the rule is gone: 400
                self._unreleased(exc)
                return

    async def _renew_now(self) -> bool:
        """One renewal; False once the lease is lost. Raises Unavailable."""
        sent = asyncio.get_running_loop().time()
        try:
            renewal = await self._client.renew_lease(
                self.key, self.rule, self._held().id, ttl=self._ttl
            )
        except LeaseNotHeld:
            self._lose("a renewal found it no longer held")
            return False
        if self.lost.is_set():  # it ran out while the renewal was on its way
            return False
        self._renewed(renewal, sent)
        self._arm()
        return True

    def _arm(self) -> None:
        """Lose the lease at once when it runs out, even while a renewal still waits on a
        router that does not answer (the call's own timeout may be longer than the TTL)."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_at(self._expires, self._ran_out)

    async def _renew_while_held(self) -> None:
        loop = asyncio.get_running_loop()
        pause: float | None = renew_every_s(self._held().ttl_ms)
        while pause is not None:
            await asyncio.sleep(pause)
            try:
                if not await self._renew_now():
                    return
                pause = renew_every_s(self._held().ttl_ms)
            except Unavailable:
                pause = self._retry_in(loop.time(), pause)
            except ShardlimitError as exc:  # e.g. the rule is gone: 400
                self._lose(f"a renewal was refused: {exc}")
                return
