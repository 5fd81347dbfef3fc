"""`AsyncClient`: the SDK's asyncio client (aiohttp). Concurrent `check()` calls of one
loop tick are coalesced into one batch request.

Every API call is a `_Call` answered by `_result` (cluster/sdk/calls.py); transport
failures become `Unavailable` in `_send`, its single send method.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import aiohttp

from cluster.sdk.async_lease import AsyncLease
from cluster.sdk.calls import (
    _T,
    DEFAULT_URL,
    Amount,
    CheckSpec,
    _batch_call,
    _bodies,
    _Call,
    _check_body,
    _check_call,
    _chunks,
    _headers,
    _offending,
    _quota_adjust_call,
    _refund_call,
    _result,
    _rule_call,
    _transport_error,
    _usage_call,
)
from cluster.sdk.decisions import Decision
from cluster.sdk.errors import (
    BadRequest,
    RequestIdReused,
    Unavailable,
    all_decisions,
    outcomes_of,
)
from cluster.sdk.lease_calls import LeaseRelease, LeaseRenewal, release_call, renew_call
from cluster.sdk.results import QuotaAdjustment, RefundResult, RuleInfo


@dataclass(slots=True)
class _Pending:
    body: dict[str, Any]
    future: asyncio.Future[Decision]


@dataclass(slots=True)
class _Coalescer:
    pending: list[_Pending] = field(default_factory=list)
    handle: asyncio.Handle | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class AsyncClient:
    """asyncio client (aiohttp). Concurrent `check()` calls of one loop tick share one batch."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        admin_token: str | None = None,
        timeout: float = 5.0,
        coalesce: bool = True,
        max_batch: int = 1000,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """`ssl_context`: as Client's."""
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.base_url = base_url.rstrip("/")
        if ssl_context is not None and not self.base_url.startswith("https://"):
            raise ValueError(f"ssl_context is for an https base_url, not {base_url!r}")
        self._ssl_context = ssl_context
        self.timeout = timeout
        self.coalesce = coalesce
        self.max_batch = max_batch
        self._headers = _headers(admin_token)
        self._session: aiohttp.ClientSession | None = None
        self._co = _Coalescer()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Send what is pending, wait for in-flight batches, close the connection pool."""
        if self._co.pending:
            self._flush()
        while self._co.tasks:
            await asyncio.gather(*self._co.tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def check(
        self,
        key: str,
        rule: str | None = None,
        *,
        limits: Sequence[Mapping[str, Any]] | None = None,
        cost: int = 1,
        amount: Amount | None = None,
        request_id: str | None = None,
        dry_run: bool = False,
    ) -> Decision:
        """Check (and consume) `cost` and `amount` against a rule or inline limits."""
        body = _check_body(key, rule, limits, cost, amount, request_id, dry_run)
        if not self.coalesce:
            return await self._send(_check_call(body))
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self._co.pending.append(_Pending(body, future))
        if len(self._co.pending) >= self.max_batch:
            self._flush()
        elif self._co.handle is None:
            self._co.handle = asyncio.get_running_loop().call_soon(self._flush)
        return await future

    async def check_many(
        self, checks: Sequence[CheckSpec | Mapping[str, Any]], *, all_or_nothing: bool = False
    ) -> list[Decision]:
        """Several checks in POST /v1/check/batch; results in the order of `checks`."""
        bodies = _bodies(checks)
        if not bodies:
            return []
        if all_or_nothing:
            if len(bodies) > self.max_batch:
                raise ValueError(f"all_or_nothing batches hold at most {self.max_batch} checks")
            return await self._send(_batch_call(bodies, True))
        outcomes: list[Decision | RequestIdReused] = []
        for chunk in _chunks(bodies, self.max_batch):
            try:
                decisions: list[Decision] = await self._send(_batch_call(chunk, False))
                outcomes += decisions
            except RequestIdReused as exc:
                outcomes += outcomes_of(exc, len(chunk))
        return all_decisions(outcomes)

    async def refund(
        self,
        key: str,
        rule: str | None = None,
        *,
        limits: Sequence[Mapping[str, Any]] | None = None,
        request_id: str,
    ) -> RefundResult:
        """Give back exactly what the decision `request_id` consumed (once)."""
        return await self._send(_refund_call(key, rule, limits, request_id))

    async def usage(self, key: str, rule: str) -> Decision:
        """Current state of a key under a rule; consumes nothing."""
        return await self._send(_usage_call(key, rule))

    async def quota_adjust(
        self,
        key: str,
        rule: str,
        *,
        request_id: str,
        delta: int | None = None,
        set: int | None = None,  # the API's field name
        delta_amount: Amount | None = None,
        set_amount: Amount | None = None,
    ) -> QuotaAdjustment:
        """Restock a quota key (needs the admin token); applied once per request_id."""
        changes = {
            "delta": delta,
            "set": set,
            "delta_amount": delta_amount,
            "set_amount": set_amount,
        }
        return await self._send(_quota_adjust_call(key, rule, request_id, changes))

    def lease(
        self, rule: str, *, key: str, wait: float | None = None, ttl: str | int | None = None
    ) -> AsyncLease:
        """`async with client.lease("exports", key=tenant) as lease:` holds a lease of the
        rule's concurrency limit while the block runs: acquired on entry (RateLimited when
        no slot is free, after up to `wait` seconds of checking again), renewed every third
        of its TTL (`ttl`: its length, default the limit's lease), released on exit. A lost
        lease sets `lease.lost` and makes the exit raise LeaseLost (cluster/sdk/async_lease.py)."""
        return AsyncLease(self, rule, key, wait=wait, ttl=ttl)

    async def renew_lease(
        self, key: str, rule: str, lease_id: str, *, ttl: str | int | None = None
    ) -> LeaseRenewal:
        """Renew a held lease for `ttl` from now (default: the limit's lease). Raises
        LeaseNotHeld once it is no longer held."""
        return await self._send(renew_call(key, rule, lease_id, ttl))

    async def release_lease(self, key: str, rule: str, lease_id: str) -> LeaseRelease:
        """Release a held lease, freeing its slot. Raises LeaseNotHeld if it was not held."""
        return await self._send(release_call(key, rule, lease_id))

    async def rule(self, name: str) -> RuleInfo:
        """A rule's definition (its limits and on_failure); needs no token."""
        return await self._send(_rule_call(name))

    async def _send(self, call: _Call[_T]) -> _T:
        if self._session is None:
            connector = None
            if self._ssl_context is not None:
                connector = aiohttp.TCPConnector(ssl=self._ssl_context)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                headers=self._headers,
            )
        try:
            async with self._session.request(
                call.method, self.base_url + call.path, data=call.body
            ) as response:
                status, raw = response.status, await response.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise _transport_error(exc) from exc
        return _result(call, status, raw)

    def _flush(self) -> None:
        co = self._co
        if co.handle is not None:
            co.handle.cancel()
            co.handle = None
        batch, co.pending = co.pending, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._dispatch(batch))
            co.tasks.add(task)
            task.add_done_callback(co.tasks.discard)

    async def _dispatch(self, batch: list[_Pending], *, split: bool = True) -> None:
        if not batch:
            return
        if len(batch) == 1:
            await self._single(batch[0])
            return
        try:
            answered: list[Decision] = await self._send(_batch_call([p.body for p in batch], False))
            decisions: list[Decision | RequestIdReused] = list(answered)
        except RequestIdReused as exc:
            decisions = outcomes_of(exc, len(batch))
        except BadRequest as exc:
            # The router validated the whole batch and ran none of it: answer the offending
            # checks individually (their own exact error) and re-send the rest together.
            bad = _offending(exc, len(batch)) if split else None
            if bad is None:
                await asyncio.gather(*(self._single(p) for p in batch))
                return
            good = [p for i, p in enumerate(batch) if i not in bad]
            await asyncio.gather(
                *(self._single(batch[i]) for i in sorted(bad)),
                self._dispatch(good, split=False),
            )
            return
        except Exception as exc:
            for pending in batch:
                _fail(pending.future, exc)
            return
        for pending, outcome in zip(batch, decisions, strict=True):
            if pending.future.done():
                continue
            if isinstance(outcome, RequestIdReused):
                pending.future.set_exception(RequestIdReused(outcome.status, outcome.problem))
            else:
                pending.future.set_result(outcome)

    async def _single(self, pending: _Pending) -> None:
        try:
            decision = await self._send(_check_call(pending.body))
        except Exception as exc:
            _fail(pending.future, exc)
        else:
            if not pending.future.done():
                pending.future.set_result(decision)


def _fail(future: asyncio.Future[Decision], exc: Exception) -> None:
    """Give each waiting caller its own exception object (tracebacks are per raise)."""
    if future.done():
        return
    if isinstance(exc, Unavailable):
        own: Exception = Unavailable(str(exc), exc.status)
        own.__cause__ = exc.__cause__ or exc
    else:
        own = exc
    future.set_exception(own)
