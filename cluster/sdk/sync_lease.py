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

from cluster.sdk.decisions import Decision
from cluster.sdk.errors import LeaseNotHeld, RateLimited, ShardlimitError, Unavailable
from cluster.sdk.lease_calls import LeaseRelease, LeaseRenewal, backoff_s, granted, renew_every_s
from cluster.sdk.lease_state import LeaseState

__all__ = ["Lease"]


class _Leasing(Protocol):
    def check(self, key: str, rule: str | None = None) -> Decision: ...
    def renew_lease(
        self, key: str, rule: str, lease_id: str, *, ttl: str | int | None = None
    ) -> LeaseRenewal: ...
    def release_lease(self, key: str, rule: str, lease_id: str) -> LeaseRelease: ...


class Lease(LeaseState):
    """A lease held for the length of a `with` block (module docstring)."""

    lost: threading.Event

    def __init__(
        self,
        client: _Leasing,
        rule: str,
        key: str,
        *,
        wait: float | None = None,
        ttl: str | int | None = None,
    ) -> None:
        super().__init__(rule, key, wait=wait, ttl=ttl, lost=threading.Event())
        self._client = client
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._timer: threading.Timer | None = None  # fires when the lease runs out

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
        self._acquired(grant, sent)
        self._arm()
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
        if self._timer is not None:
            self._timer.cancel()
        if not self.lost.is_set():
            self._release()
        self._raise_if_lost(exc)

    def _release(self) -> None:
        """Release the lease; sent again while the router or node is unavailable (the
        node restarting, a failover), within RELEASE_PATIENCE_S and the lease's life."""
        grant, started, attempt = self._held(), time.monotonic(), 0
        while True:
            try:
                self.released = self._client.release_lease(self.key, self.rule, grant.id)
                return
            except LeaseNotHeld:
                if attempt == 0:
                    self._lose("it was no longer held when released")
                return  # after an unanswered try, that try may have freed it
            except Unavailable as exc:
                pause = self._release_retry_in(time.monotonic(), started, attempt)
                if pause is None:
                    self._unreleased(exc)
                    return
                time.sleep(pause)  # retry cadence
                attempt += 1
            except ShardlimitError as exc:  # refused, e.g. the rule is gone: 400
                self._unreleased(exc)
                return

    def _renew_now(self) -> bool:
        """One renewal; False once the lease is lost. Raises Unavailable."""
        sent = time.monotonic()
        try:
            renewal = self._client.renew_lease(self.key, self.rule, self._held().id, ttl=self._ttl)
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
        self._timer = threading.Timer(max(0.0, self._expires - time.monotonic()), self._ran_out)
        self._timer.daemon = True
        self._timer.start()

    def _renew_while_held(self) -> None:
        pause: float | None = renew_every_s(self._held().ttl_ms)
        while pause is not None and not self._stop.wait(pause):
            try:
                if not self._renew_now():
                    return
                pause = renew_every_s(self._held().ttl_ms)
            except Unavailable:
                pause = self._retry_in(time.monotonic(), pause)
            except ShardlimitError as exc:  # e.g. the rule is gone: 400
                self._lose(f"a renewal was refused: {exc}")
                return
