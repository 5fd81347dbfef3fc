"""`with client.lease("exports", key=tenant) as lease:`: the blocking client's form of
cluster/sdk/async_lease.py, with the same behaviour. The watchdog is a daemon thread
that renews through the same (thread-safe) client; `lease.lost` is a threading.Event,
and the exit raises LeaseLost when the lease was lost and the body raised nothing."""

from __future__ import annotations

import contextlib
import threading
import time
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

__all__ = ["Lease"]

MIN_RETRY_S = 0.05


class _Leasing(Protocol):
    def check(self, key: str, rule: str | None = None) -> Decision: ...
    def renew_lease(
        self, key: str, rule: str, lease_id: str, *, ttl: str | int | None = None
    ) -> LeaseRenewal: ...
    def release_lease(self, key: str, rule: str, lease_id: str) -> LeaseRelease: ...


class Lease:
    """A lease held for the length of a `with` block (module docstring)."""

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
        self.lost = threading.Event()
        self.lost_why: str | None = None
        self.released: LeaseRelease | None = None
        self.renewals = 0  # renewals that got through
        self._expires = 0.0  # time.monotonic() by which it surely ran out unless renewed
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None

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

    def __enter__(self) -> Lease:
        deadline = None if self._wait is None else time.monotonic() + self._wait
        attempt = 0
        while True:
            sent = time.monotonic()
            decision = self._client.check(self.key, self.rule)
            grant = granted(decision)
            if grant is not None:
                break
            left = 0.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise RateLimited(decision)
            time.sleep(backoff_s(attempt, decision, left))
            attempt += 1
        self.grant, self._expires = grant, sent + grant.ttl_ms / 1000
        if self._ttl is not None:  # a lease of its own length from the start
            try:
                self._renew_now()
            except BaseException:
                with contextlib.suppress(ShardlimitError):
                    self._client.release_lease(self.key, self.rule, grant.id)
                raise
        self._watchdog = threading.Thread(
            target=self._renew_while_held, name=f"lease-watchdog {grant.id}", daemon=True
        )
        self._watchdog.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._watchdog is not None:
            self._watchdog.join()
        grant = self._held()
        if not self.lost.is_set():
            try:
                self.released = self._client.release_lease(self.key, self.rule, grant.id)
            except LeaseNotHeld:
                self._lose("it was no longer held when released")
            except ShardlimitError:
                pass  # the router is unreachable: the lease runs out by itself
        if self.lost.is_set() and exc is None:
            raise LeaseLost(grant.id, grant.fencing, self.lost_why or "lost")

    def _held(self) -> LeaseGrant:
        if self.grant is None:
            raise RuntimeError("the lease is acquired on entering `with`")
        return self.grant

    def _lose(self, why: str) -> None:
        if not self.lost.is_set():
            self.lost_why = why
            self.lost.set()

    def _renew_now(self) -> bool:
        """One renewal; False once the lease is lost. Raises Unavailable."""
        sent = time.monotonic()
        try:
            renewal = self._client.renew_lease(self.key, self.rule, self._held().id, ttl=self._ttl)
        except LeaseNotHeld:
            self._lose("a renewal found it no longer held")
            return False
        self._expires = sent + renewal.ttl_ms / 1000
        self.grant = LeaseGrant(renewal.lease_id, renewal.fencing, renewal.ttl_ms)
        self.renewals += 1
        return True

    def _renew_while_held(self) -> None:
        pause = renew_every_s(self._held().ttl_ms)
        while not self._stop.wait(pause):
            try:
                if not self._renew_now():
                    return
                pause = renew_every_s(self._held().ttl_ms)
            except Unavailable:
                left = self._expires - time.monotonic()
                if left <= 0:
                    self._lose("no renewal got through before it ran out")
                    return
                pause = max(MIN_RETRY_S, min(pause, left / 4))
            except ShardlimitError as exc:  # e.g. the rule is gone: 400
                self._lose(f"a renewal was refused: {exc}")
                return
