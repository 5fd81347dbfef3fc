"""`POST /v1/lease/renew` and `/v1/lease/release` (router/decide/leases.py), from the raw
body to the JSON answer: the one implementation behind both the aiohttp handlers and the
lean front (router/front/server.py), as router/api/check_answers.py is for checks. A
lease-not-found (404) and bad bodies raise, answered by the caller through
router/api/problems.py."""

from __future__ import annotations

import msgspec

from cluster import wire
from cluster.model.errors import Problems
from cluster.web import exact_json
from cluster.web.problem import Problem
from router.api.check_answers import JsonAnswer
from router.decide.leases import Action, LeaseRequest, lease_request, parse_lease
from router.rules.book import RuleBook
from router.service import Router

RENEW_PATH = "/v1/lease/renew"
RELEASE_PATH = "/v1/lease/release"


class _Plain(msgspec.Struct, forbid_unknown_fields=True):
    """The common body: its three strings, decoded and typed in one pass."""

    key: str
    rule: str
    lease_id: str


_PLAIN = msgspec.json.Decoder(_Plain)


def _request(raw: bytes, action: Action, rules: RuleBook) -> LeaseRequest:
    """The body's request; raises Problem (400) with every problem it has. The common
    body (exactly `key`, `rule` and `lease_id`, all strings) is decoded and typed in one
    pass; any other is read whole and goes through parse_lease, which also reports unknown
    fields and wrong types."""
    problems = Problems()
    try:
        plain = _PLAIN.decode(raw)
    except wire.DECODE_ERRORS:
        pass
    else:
        fields = (plain.key, plain.rule, plain.lease_id, None)
        return problems.result(lease_request(action, *fields, rules, problems))
    try:
        body = exact_json.loads(raw)
    except exact_json.JSONDecodeError as exc:
        raise Problem(400, "malformed-json", f"body is not valid JSON: {exc}") from None
    return problems.result(parse_lease(action, body, rules, problems))


async def renew_answer(router: Router, raw: bytes) -> JsonAnswer:
    """200 with the lease's new ttl_ms; raises LeaseNotFound when it is no longer held."""
    renewed = await router.lease(_request(raw, "renew", router.rules))
    return JsonAnswer(200, msgspec.json.encode(renewed), None)


async def release_answer(router: Router, raw: bytes) -> JsonAnswer:
    """200 once the lease is released; raises LeaseNotFound when it was not held."""
    released = await router.lease(_request(raw, "release", router.rules))
    return JsonAnswer(200, msgspec.json.encode(released), None)
