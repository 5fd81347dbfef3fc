"""What a lease held by the SDK knows and decides, without I/O: the grant, when it surely
runs out, whether it was lost and why. `AsyncLease` (cluster/sdk/async_lease.py) and
`Lease` (cluster/sdk/sync_lease.py) are its two shells: they make the calls, sleep, and
run the watchdog as a task or a thread."""

from __future__ import annotations

import logging
from typing import Protocol

from cluster.sdk.decisions import LeaseGrant
from cluster.sdk.errors import LeaseLost
from cluster.sdk.lease_calls import LeaseRelease, LeaseRenewal

__all__ = ["MIN_RETRY_S", "RELEASE_PATIENCE_S", "LeaseState"]

MIN_RETRY_S = 0.05
# How long an exit keeps sending a release the router or node could not take (a node
# restarting, a failover): never past the lease's own end, when its slot frees anyway.
RELEASE_PATIENCE_S = 5.0
log = logging.getLogger("shardlimit.leases")


class _Flag(Protocol):
    """asyncio.Event or threading.Event."""

    def is_set(self) -> bool: ...
    def set(self) -> None: ...


class LeaseState:
    # How the lease is entered, for the error when it is used before.
    entered_by = "with"

    def __init__(
        self, rule: str, key: str, *, wait: float | None, ttl: str | int | None, lost: _Flag
    ) -> None:
        self.rule = rule
        self.key = key
        self._wait = wait
        self._ttl = ttl
        self.grant: LeaseGrant | None = None
        self.lost = lost
        self.lost_why: str | None = None
        self.released: LeaseRelease | None = None
        self.unreleased_why: str | None = None  # why the exit's release did not get through
        self.renewals = 0  # renewals that got through
        self._expires = 0.0  # on the shell's clock: when it surely ran out unless renewed

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

    def _held(self) -> LeaseGrant:
        if self.grant is None:
            raise RuntimeError(f"the lease is acquired on entering `{self.entered_by}`")
        return self.grant

    def _lose(self, why: str) -> None:
        if not self.lost.is_set():
            self.lost_why = why
            self.lost.set()

    def _acquired(self, grant: LeaseGrant, sent: float) -> None:
        """Granted by a check sent at `sent` (the lease's TTL runs from no later)."""
        self.grant, self._expires = grant, sent + grant.ttl_ms / 1000

    def _renewed(self, renewal: LeaseRenewal, sent: float) -> None:
        self._expires = sent + renewal.ttl_ms / 1000
        self.grant = LeaseGrant(renewal.lease_id, renewal.fencing, renewal.ttl_ms)
        self.renewals += 1

    def _ran_out(self) -> None:
        """The shell's timer at `_expires`: no renewal was answered in time, so the lease
        may be another holder's by now, whatever a renewal still in flight answers."""
        self._lose("no renewal got through before it ran out")

    def _retry_in(self, now: float, pause: float) -> float | None:
        """After a renewal found the router unreachable: seconds until the next try, or
        None when the lease surely ran out meanwhile (it is then lost)."""
        left = self._expires - now
        if left <= 0:
            self._lose("no renewal got through before it ran out")
            return None
        return max(MIN_RETRY_S, min(pause, left / 4))

    def _release_retry_in(self, now: float, started: float, attempt: int) -> float | None:
        """After release number `attempt` (from 0, the exit began at `started`) found the
        router or node unavailable: seconds until the next, or None to stop (the lease
        runs out by itself first, or the exit has waited RELEASE_PATIENCE_S)."""
        left = min(self._expires, started + RELEASE_PATIENCE_S) - now
        if left <= 0:
            return None
        return min(left, MIN_RETRY_S * 2.0**attempt, 1.0)

    def _unreleased(self, error: Exception) -> None:
        """The exit's release did not get through: its slot frees when the lease runs out."""
        self.unreleased_why = str(error)
        grant = self._held()
        log.warning(
            "lease %s of key %r under rule %r not released (%s): its slot frees when the "
            "lease runs out, within %d ms of its last renewal",
            grant.id,
            self.key,
            self.rule,
            error,
            grant.ttl_ms,
        )

    def _raise_if_lost(self, body_raised: BaseException | None) -> None:
        """At the exit: LeaseLost when the lease was lost, unless the body raised its own."""
        if self.lost.is_set() and body_raised is None:
            grant = self._held()
            raise LeaseLost(grant.id, grant.fencing, self.lost_why or "lost")
