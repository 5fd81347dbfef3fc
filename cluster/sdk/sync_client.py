"""`Client`: the SDK's blocking client, over one persistent HTTP/1.1 connection.

Every API call is a `_Call` answered by `_result` (cluster/sdk/calls.py); transport
failures become `Unavailable` in `_send`, its single send method.
"""

from __future__ import annotations

import contextlib
import http.client
import ssl
import threading
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

from cluster.sdk.calls import (
    _T,
    DEFAULT_URL,
    Amount,
    CheckSpec,
    _batch_call,
    _bodies,
    _Call,
    _check_call,
    _chunks,
    _headers,
    _quota_adjust_call,
    _refund_call,
    _result,
    _rule_call,
    _transport_error,
    _usage_call,
)
from cluster.sdk.decisions import Decision
from cluster.sdk.errors import RequestIdReused, all_decisions, outcomes_of
from cluster.sdk.lease_calls import LeaseRelease, LeaseRenewal, release_call, renew_call
from cluster.sdk.results import QuotaAdjustment, RefundResult, RuleInfo
from cluster.sdk.sync_lease import Lease


class Client:
    """Blocking client over one persistent HTTP/1.1 connection (thread-safe, no coalescing)."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        admin_token: str | None = None,
        timeout: float = 5.0,
        max_batch: int = 1000,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """`ssl_context`: for an https router with a private CA, or mutual TLS
        (`ssl.create_default_context(cafile=...)`, then `load_cert_chain`); the
        system's trust store otherwise."""
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.base_url = base_url.rstrip("/")
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be an http(s) URL, not {base_url!r}")
        self._https = parts.scheme == "https"
        if ssl_context is not None and not self._https:
            raise ValueError(f"ssl_context is for an https base_url, not {base_url!r}")
        self._ssl_context = ssl_context
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

    def lease(
        self, rule: str, *, key: str, wait: float | None = None, ttl: str | int | None = None
    ) -> Lease:
        """`with client.lease("exports", key=tenant) as lease:` holds a lease of the rule's
        concurrency limit while the block runs, as AsyncClient.lease does, with a watchdog
        thread (cluster/sdk/sync_lease.py)."""
        return Lease(self, rule, key, wait=wait, ttl=ttl)

    def renew_lease(
        self, key: str, rule: str, lease_id: str, *, ttl: str | int | None = None
    ) -> LeaseRenewal:
        """Renew a held lease for `ttl` from now (default: the limit's lease). Raises
        LeaseNotHeld once it is no longer held."""
        return self._send(renew_call(key, rule, lease_id, ttl))

    def release_lease(self, key: str, rule: str, lease_id: str) -> LeaseRelease:
        """Release a held lease, freeing its slot. Raises LeaseNotHeld if it was not held."""
        return self._send(release_call(key, rule, lease_id))

    def rule(self, name: str) -> RuleInfo:
        """A rule's definition (its limits and on_failure); needs no token."""
        return self._send(_rule_call(name))

    def _connect(self) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=self.timeout, context=self._ssl_context
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)

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
