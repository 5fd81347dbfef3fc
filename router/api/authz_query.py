"""`GET /v1/authz`, forward-auth for gateways: its query (rule, key or the header holding
it, cost, deny status) parsed into the check it asks for."""

from __future__ import annotations

import re
from collections.abc import Mapping

import msgspec
from multidict import MultiMapping

from cluster.model.errors import Problems
from cluster.model.limits import MAX_COUNT
from router.requests import CheckRequest, parse_check
from router.rules.book import RuleBook

DENY_STATUSES = (429, 403, 401)  # nginx's auth_request passes only 401/403 on as denials
_DENY_STATUS_TEXT = {str(status) for status in DENY_STATUSES}
_COST = re.compile("[0-9]+")


class AuthzRequest(msgspec.Struct, frozen=True):
    check: CheckRequest
    deny_status: int


def _client_address(forwarded_for: list[str]) -> str:
    """The address the nearest proxy saw: the last entry of X-Forwarded-For (earlier
    entries come from the client and can be forged). Lines of the header are one list
    (RFC 9110, 5.3): a proxy that adds a line of its own rather than appending to the
    client's puts its entry last, where a client cannot."""
    return ",".join(forwarded_for).rsplit(",", 1)[-1].strip()


def _header_key(header: str, headers: MultiMapping[str], problems: Problems) -> str | None:
    """The key `key_header` names: X-Forwarded-For's last entry, else the header's value,
    which must then be given once (of two, the client may have sent either)."""
    lines = headers.getall(header, [])
    if header.lower() == "x-forwarded-for":
        key = _client_address(lines) if lines else ""
    elif len(lines) > 1:
        problems.add("key_header", f"the request has {len(lines)} '{header}' headers: give one")
        return None
    else:
        key = lines[0].strip() if lines else ""
    if not lines:
        problems.add("key_header", f"the request has no '{header}' header to take the key from")
        return None
    if not key:
        problems.add("key_header", f"the request's '{header}' header holds no key")
        return None
    return key


def parse_authz(
    query: Mapping[str, str], headers: MultiMapping[str], rules: RuleBook, problems: Problems
) -> AuthzRequest | None:
    """`GET /v1/authz`: rule, key (or `key_header`: the request header holding the key),
    cost (default 1), deny_status (default 429)."""
    key: str | None = query.get("key")
    header = query.get("key_header")
    if key is not None and header is not None:
        problems.add("key_header", "give either 'key' or 'key_header', not both")
    elif header is not None:
        key = _header_key(header, headers, problems)
    cost: int | str = query.get("cost", "1")
    if isinstance(cost, str) and _COST.fullmatch(cost):  # not isdigit(): "²" is a digit
        significant = cost.lstrip("0") or "0"
        cost = int(significant) if len(significant) <= 13 else MAX_COUNT + 1
    deny_raw = query.get("deny_status", "429")
    deny_status = int(deny_raw) if deny_raw in _DENY_STATUS_TEXT else 0
    if deny_status not in DENY_STATUSES:
        problems.add("deny_status", f"must be one of {', '.join(map(str, DENY_STATUSES))}")
    body = {"key": key, "rule": query.get("rule"), "cost": cost}
    check = parse_check(body, rules, problems)
    if check is not None and check.rule.leases:
        problems.add("rule", "a lease must be released: use /v1/check for concurrency rules")
    if check is None or problems.errors:
        return None
    return AuthzRequest(check, deny_status)
