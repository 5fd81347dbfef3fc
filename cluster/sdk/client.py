"""Python client SDK for the shardlimit router: `Client` (blocking) and `AsyncClient` (aiohttp).

Both clients describe every API call as a `_Call` and hand the answer to one function,
`_result` (cluster/sdk/calls.py), which turns (status, body bytes) into a typed result or
an exception. Transport failures are turned into `Unavailable` at each client's single
send method.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

import aiohttp

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
from cluster.sdk.errors import (
    AlreadyRefunded,
    BadRequest,
    NotFound,
    RequestIdReused,
    ShardlimitError,
    Unavailable,
    all_decisions,
    outcomes_of,
)
from cluster.sdk.results import (
    Decision,
    GivenBack,
    LimitState,
    QuotaAdjustment,
    RefundResult,
    RuleInfo,
)

__all__ = [
    "AlreadyRefunded",
    "AsyncClient",
    "BadRequest",
    "CheckSpec",
    "Client",
    "Decision",
    "GivenBack",
    "LimitState",
    "NotFound",
    "QuotaAdjustment",
    "RefundResult",
    "RequestIdReused",
    "RuleInfo",
    "ShardlimitError",
    "Unavailable",
]

# --------------------------------------------------------------------------- async client


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
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.base_url = base_url.rstrip("/")
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

    async def rule(self, name: str) -> RuleInfo:
        """A rule's definition (its limits and on_failure); needs no token."""
        return await self._send(_rule_call(name))

    async def _send(self, call: _Call[_T]) -> _T:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout), headers=self._headers
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


# --------------------------------------------------------------------------- sync client


class Client:
    """Blocking client over one persistent HTTP/1.1 connection (thread-safe, no coalescing)."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        admin_token: str | None = None,
        timeout: float = 5.0,
        max_batch: int = 1000,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.base_url = base_url.rstrip("/")
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be an http(s) URL, not {base_url!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path
        self.timeout = timeout
        self.max_batch = max_batch
        self._headers = _headers(admin_token)
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (the next call reconnects)."""
        with self._lock:
            self._drop()

    def check(
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
        body = CheckSpec(key, rule, limits, cost, amount, request_id, dry_run).to_body()
        return self._send(_check_call(body))

    def check_many(
        self, checks: Sequence[CheckSpec | Mapping[str, Any]], *, all_or_nothing: bool = False
    ) -> list[Decision]:
        """Several checks in POST /v1/check/batch; results in the order of `checks`."""
        bodies = _bodies(checks)
        if not bodies:
            return []
        if all_or_nothing:
            if len(bodies) > self.max_batch:
                raise ValueError(f"all_or_nothing batches hold at most {self.max_batch} checks")
            return self._send(_batch_call(bodies, True))
        outcomes: list[Decision | RequestIdReused] = []
        for chunk in _chunks(bodies, self.max_batch):
            try:
                decisions: list[Decision] = self._send(_batch_call(chunk, False))
                outcomes += decisions
            except RequestIdReused as exc:
                outcomes += outcomes_of(exc, len(chunk))
        return all_decisions(outcomes)

    def refund(
        self,
        key: str,
        rule: str | None = None,
        *,
        limits: Sequence[Mapping[str, Any]] | None = None,
        request_id: str,
    ) -> RefundResult:
        """Give back exactly what the decision `request_id` consumed (once)."""
        return self._send(_refund_call(key, rule, limits, request_id))

    def usage(self, key: str, rule: str) -> Decision:
        """Current state of a key under a rule; consumes nothing."""
        return self._send(_usage_call(key, rule))

    def quota_adjust(
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
        return self._send(_quota_adjust_call(key, rule, request_id, changes))

    def rule(self, name: str) -> RuleInfo:
        """A rule's definition (its limits and on_failure); needs no token."""
        return self._send(_rule_call(name))

    def _connect(self) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return kind(self._host, self._port, timeout=self.timeout)

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
            self._conn = None

    def _send(self, call: _Call[_T]) -> _T:
        with self._lock:
            reused = self._conn is not None
            try:
                status, raw = self._exchange(call)
            except (ConnectionResetError, BrokenPipeError, http.client.BadStatusLine) as exc:
                self._drop()
                if not reused:
                    raise _transport_error(exc) from exc
                # The server closed an idle keep-alive connection: retry once on a new one.
                try:
                    status, raw = self._exchange(call)
                except (OSError, http.client.HTTPException) as again:
                    self._drop()
                    raise _transport_error(again) from again
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                raise _transport_error(exc) from exc
        return _result(call, status, raw)

    def _exchange(self, call: _Call[Any]) -> tuple[int, bytes]:
        if self._conn is None:
            self._conn = self._connect()
        conn = self._conn
        conn.request(call.method, self._prefix + call.path, body=call.body, headers=self._headers)
        response = conn.getresponse()
        raw = response.read()
        if response.will_close:
            self._drop()
        return response.status, raw
