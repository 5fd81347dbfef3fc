"""POST /v1/lease/renew and /v1/lease/release: one lease of a `concurrency` limit, by id.

Body: `key`, `rule` (a named rule with a concurrency limit), `lease_id` (as the check's
decision gave it), and for a renewal an optional `ttl` (a duration, at most 1d; default:
the limit's `lease`), counted from now on the node's clock. The op goes to the key's node
as a check does (`ClusterView.execute`: a moved key is followed, a moving key is pulled
on first touch), and node/store/lua/concurrency.lua's `held` acts on the lease only while
it is held: otherwise (expired, released, never granted) LeaseNotFound, a 404
`lease-not-found`, and nothing changes. Only the id names a lease: its random part
(cluster/model/lease_ids.py) keeps anyone else from releasing a slot they do not hold.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from cluster import wire
from cluster.model import answers
from cluster.model.errors import Problems
from cluster.model.lease_ids import parse_lease_id
from cluster.model.limits import MAX_LEASE_MS, parse_duration
from router.channel.outcomes import result_failure
from router.control.cluster_view import ClusterView
from router.errors import LeaseNotFound
from router.requests import named_rule, parse_key
from router.rules.book import Rule, RuleBook

__all__ = ["Action", "LeaseRequest", "lease_request", "parse_lease", "run_lease"]

Action = Literal["renew", "release"]
FIELDS: dict[str, frozenset[str]] = {
    "renew": frozenset({"key", "rule", "lease_id", "ttl"}),
    "release": frozenset({"key", "rule", "lease_id"}),
}


class LeaseRequest(msgspec.Struct, frozen=True):
    action: Action
    key: str
    rule: Rule
    index: int  # the concurrency limit's place in the rule
    lease_id: str
    fencing: int
    nonce: int
    ttl_ms: int  # renew: the lease's new lifetime from now (0 for a release)


def lease_request(
    action: Action,
    key: Any,
    name: Any,
    lease_id: Any,
    ttl: Any,
    rules: RuleBook,
    problems: Problems,
) -> LeaseRequest | None:
    """The request these fields of a renew or release body make; None after reporting
    every problem in them."""
    before = len(problems.errors)
    key = parse_key(key, "key", problems)
    parsed_id = parse_lease_id(lease_id)
    if lease_id is None:
        problems.add("lease_id", "is required: the lease's id as its check's decision gave it")
    elif parsed_id is None:
        problems.add(
            "lease_id",
            "is not a lease id: `<fencing>.<12 hex digits>` as its check's decision gave "
            "it, e.g. '17.3f9a0c2b11de'",
        )
    rule = named_rule(name, rules, problems, "a concurrency limit")
    index = -1 if rule is None else rule.lease_at
    if rule is not None and index < 0:
        problems.add("rule", f"rule '{rule.name}' has no concurrency limit: it grants no leases")
    ttl_ms = 0
    if action == "renew":
        ttl_ms = rule.limits[index].window_ms if rule is not None and index >= 0 else 0
        if ttl is not None:
            ttl_ms = parse_duration(ttl, "ttl", problems, MAX_LEASE_MS)
    if len(problems.errors) != before or rule is None or parsed_id is None:
        return None
    fencing, nonce = parsed_id
    return LeaseRequest(action, key, rule, index, str(lease_id), fencing, nonce, ttl_ms)


def parse_lease(
    action: Action, body: Any, rules: RuleBook, problems: Problems
) -> LeaseRequest | None:
    """A renew or release body; None after reporting every problem."""
    if not isinstance(body, dict):
        problems.add("body", "must be a JSON object")
        return None
    before = len(problems.errors)
    if not FIELDS[action].issuperset(body):
        for name in sorted(set(body) - FIELDS[action]):
            problems.add(name, "unknown field")
    get = body.get
    request = lease_request(
        action, get("key"), get("rule"), get("lease_id"), get("ttl"), rules, problems
    )
    return request if len(problems.errors) == before else None


def lease_op(request: LeaseRequest, quota_ttl_ms: int) -> wire.Op:
    rule = request.rule
    return wire.Op(
        request.action,
        request.key,
        rule.name,
        rule.lease_wire,
        [0],
        quota_ttl_ms=quota_ttl_ms,
        durable=rule.durability == "replica",
        lease=[request.fencing, request.nonce, request.ttl_ms],
    )


async def run_lease(
    view: ClusterView, request: LeaseRequest, quota_ttl_ms: int
) -> answers.LeaseRenewed | answers.LeaseReleased:
    """The renewed or released lease. Raises LeaseNotFound, or NodeUnavailable (a renewal
    may be sent again; a release that was applied but not answered is then not found)."""
    _node, result = await view.execute(request.key, lease_op(request, quota_ttl_ms))
    if not isinstance(result, wire.Leased):
        raise result_failure(result)
    if result.status == wire.LeaseStatus.NOT_HELD:
        raise LeaseNotFound(
            f"lease {request.lease_id!r} of key {request.key!r} under rule "
            f"{request.rule.name!r} is not held: it expired, was released or never existed"
        )
    if result.status == wire.LeaseStatus.RENEWED:
        lease = answers.Lease(id=request.lease_id, fencing=request.fencing, ttl_ms=result.ttl_ms)
        return answers.LeaseRenewed(
            key=request.key, rule=request.rule.name, lease=lease, renewed_at_ms=result.at_ms
        )
    return answers.LeaseReleased(
        key=request.key,
        rule=request.rule.name,
        lease_id=request.lease_id,
        fencing=request.fencing,
        released=True,
        released_at_ms=result.at_ms,
    )
