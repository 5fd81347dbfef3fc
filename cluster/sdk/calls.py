"""The SDK's one transport boundary: every API call described as a `_Call` (method, path,
body, how to read a success), and `_result`, which turns (status, body bytes) into a
typed result or an exception. Both clients send calls and hand answers here."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Generic, TypeVar
from urllib.parse import quote, urlencode

import msgspec
import orjson

from cluster.sdk.decisions import Decision
from cluster.sdk.errors import (
    AlreadyRefunded,
    BadRequest,
    LeaseNotHeld,
    NotFound,
    RequestIdReused,
    Unavailable,
    is_reused,
)
from cluster.sdk.results import (
    QuotaAdjustment,
    RefundResult,
    RuleInfo,
    decision_of,
    decisions_of,
    parse_decision,
    parse_decisions,
    parse_quota_adjustment,
    parse_refund,
    parse_rule_info,
)

DEFAULT_URL = "http://127.0.0.1:8080"
_USER_AGENT = "shardlimit-python/0.1"
_T = TypeVar("_T")
Amount = Decimal | str | int


@dataclass(frozen=True, slots=True)
class CheckSpec:
    """One check of `check_many` (a dict with the same keys is accepted too)."""

    key: str
    rule: str | None = None
    limits: Sequence[Mapping[str, Any]] | None = None
    cost: int = 1
    amount: Amount | None = None
    request_id: str | None = None
    dry_run: bool = False

    def to_body(self) -> dict[str, Any]:
        return _check_body(
            self.key, self.rule, self.limits, self.cost, self.amount, self.request_id, self.dry_run
        )


def _check_body(
    key: str,
    rule: str | None,
    limits: Sequence[Mapping[str, Any]] | None,
    cost: int,
    amount: Amount | None,
    request_id: str | None,
    dry_run: bool,
) -> dict[str, Any]:
    """A check's JSON body (what CheckSpec(...).to_body() gives)."""
    body: dict[str, Any] = {"key": key, "cost": cost}
    if rule is not None:
        body["rule"] = rule
    if limits is not None:
        body["limits"] = [dict(limit) for limit in limits]
    if amount is not None:
        body["amount"] = _amount(amount)
    if request_id is not None:
        body["request_id"] = request_id
    if dry_run:
        body["dry_run"] = True
    return body


def _amount(value: Amount) -> str:
    if isinstance(value, bool) or not isinstance(value, Decimal | str | int):
        raise TypeError(f"amount must be Decimal, str or int, not {type(value).__name__}")
    return str(value)


@dataclass(frozen=True, slots=True)
class _Call(Generic[_T]):
    """One API request and how to read its successful answer."""

    method: str
    path: str
    body: bytes | None
    parse: Callable[[dict[str, Any]], _T]
    decode: Callable[[bytes], _T] | None = None  # a 200's text straight to the result


def _json(value: Any) -> bytes:
    def default(obj: Any) -> Any:
        if isinstance(obj, Decimal):
            return str(obj)
        raise TypeError(f"cannot send {type(obj).__name__} as JSON")

    return orjson.dumps(value, default=default)


def _check_call(body: dict[str, Any]) -> _Call[Decision]:
    return _Call("POST", "/v1/check", _json(body), parse_decision, decision_of)


def _batch_call(checks: Sequence[dict[str, Any]], all_or_nothing: bool) -> _Call[list[Decision]]:
    body = {"checks": list(checks), "all_or_nothing": all_or_nothing}
    expected = len(checks)

    def counted(decisions: list[Decision]) -> list[Decision]:
        if len(decisions) != expected:
            raise ValueError(f"{len(decisions)} results for {expected} checks")
        return decisions

    return _Call(
        "POST",
        "/v1/check/batch",
        _json(body),
        lambda data: counted(parse_decisions(data)),
        lambda raw: counted(decisions_of(raw)),
    )


def _refund_call(
    key: str, rule: str | None, limits: Sequence[Mapping[str, Any]] | None, request_id: str
) -> _Call[RefundResult]:
    body: dict[str, Any] = {"key": key, "request_id": request_id}
    if rule is not None:
        body["rule"] = rule
    if limits is not None:
        body["limits"] = [dict(limit) for limit in limits]
    return _Call("POST", "/v1/refund", _json(body), parse_refund)


def _quota_adjust_call(
    key: str,
    rule: str,
    request_id: str,
    changes: Mapping[str, int | Amount | None],
) -> _Call[QuotaAdjustment]:
    body: dict[str, Any] = {"key": key, "rule": rule, "request_id": request_id}
    for name, value in changes.items():
        if value is not None:
            body[name] = _amount(value) if name.endswith("_amount") else value
    return _Call("POST", "/v1/quota/adjust", _json(body), parse_quota_adjustment)


def _usage_call(key: str, rule: str) -> _Call[Decision]:
    return _Call("GET", "/v1/usage?" + urlencode({"key": key, "rule": rule}), None, parse_decision)


def _rule_call(name: str) -> _Call[RuleInfo]:
    return _Call("GET", "/v1/rules/" + quote(name, safe=""), None, parse_rule_info)


def _result(call: _Call[_T], status: int, raw: bytes) -> _T:
    """The single transport boundary: an HTTP answer -> a typed result or an exception."""
    if status == 200 and call.decode is not None:
        with contextlib.suppress(msgspec.DecodeError, ValueError, TypeError, ArithmeticError):
            return call.decode(raw)  # else the general path below says what is wrong
    try:
        data = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        data = None
    if status >= 500:
        detail = data.get("detail") if isinstance(data, dict) else None
        raise Unavailable(f"router answered {status}: {detail or 'no detail'}", status)
    # 429 from /v1/check is a denial, not an error.
    if status == 200 or (status == 429 and isinstance(data, dict) and "allowed" in data):
        if not isinstance(data, dict):
            raise Unavailable(f"router answered {status} without a JSON object", status)
        try:
            return call.parse(data)
        except (KeyError, TypeError, ValueError, InvalidOperation, msgspec.ValidationError) as exc:
            raise Unavailable(f"unexpected answer from the router: {exc!r}", status) from exc
    problem: dict[str, Any] = data if isinstance(data, dict) else {"status": status}
    if status == 404:
        lease = str(problem.get("type", "")).endswith("/lease-not-found")
        raise (LeaseNotHeld if lease else NotFound)(status, problem)
    if status == 409 and str(problem.get("type", "")).endswith("/already-refunded"):
        raise AlreadyRefunded(status, problem)
    if is_reused(status, problem):
        raise RequestIdReused(status, problem)
    if 400 <= status < 500:
        raise BadRequest(status, problem)
    raise Unavailable(f"unexpected status {status}", status)


def _transport_error(exc: BaseException) -> Unavailable:
    return Unavailable(f"cannot reach the router: {type(exc).__name__}: {exc}".rstrip(": "))


_BATCH_FIELD = re.compile(r"^checks\[(\d+)\]")


def _offending(error: BadRequest, size: int) -> set[int] | None:
    """Indexes named by a batch validation error, or None if it is not only about checks[i]."""
    indexes: set[int] = set()
    for name, _message in error.errors:
        match = _BATCH_FIELD.match(name)
        if match is None or int(match.group(1)) >= size:
            return None
        indexes.add(int(match.group(1)))
    return indexes or None


def _headers(admin_token: str | None) -> dict[str, str]:
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, application/problem+json",
        "User-Agent": _USER_AGENT,
    }
    if admin_token is not None:
        headers["Authorization"] = f"Bearer {admin_token}"
    return headers


def _bodies(checks: Sequence[CheckSpec | Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [(c if isinstance(c, CheckSpec) else CheckSpec(**c)).to_body() for c in checks]


def _chunks(bodies: list[dict[str, Any]], size: int) -> list[list[dict[str, Any]]]:
    return [bodies[i : i + size] for i in range(0, len(bodies), size)]
