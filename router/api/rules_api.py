"""The cluster's rules over HTTP: list and read them; replace them all, or put or delete
one (admin, with If-Match on the rules version). A change goes to the cluster's rules
(router/rules/cluster_rules.py); the router's rules file is never written."""

from __future__ import annotations

from aiohttp import web

from cluster.model.errors import FieldError, Problems, did_you_mean
from cluster.model.limits import expired_quotas
from cluster.web.problem import invalid, json_body, json_response
from router.api.handler_tools import admin_only, router_of
from router.api.if_match import Preconditions, preconditions
from router.errors import PreconditionFailed, UnknownRule
from router.requests import rule_name
from router.rules.book import Rule, parse_rule, parse_rules_document
from router.rules.cluster_rules import RulesChange


def _etag(version: int) -> dict[str, str]:
    return {"ETag": f'"{version}"'}


async def _publish(request: web.Request, change: RulesChange, conditions: Preconditions) -> int:
    """Apply `change` to the cluster's rules (the router's rules file is never written)."""
    version: int = await router_of(request).cluster_rules.publish(change, conditions.version_holds)
    return version


def _require(conditions: Preconditions, name: str, current: dict[str, Rule]) -> None:
    """The `*` conditions, weighed against the rules the change is applied to."""
    why = conditions.existence_fails(name in current)
    if why is not None:
        state = f"rule {name!r} exists" if name in current else f"no rule named {name!r}"
        raise PreconditionFailed(f"{state} ({why})")


async def list_rules(request: web.Request) -> web.Response:
    book = router_of(request).rules
    listing = [rule.to_dict() for _, rule in sorted(book.rules.items())]
    answer = {"version": book.version, "rules": listing, "file": book.file_block()}
    return json_response(answer, headers=_etag(book.version))


@admin_only
async def put_rules(request: web.Request) -> web.Response:
    """Replace every rule at once (`shardlimit rules apply`)."""
    conditions = preconditions(request.headers)
    body = await json_body(request)
    if not isinstance(body, dict) or not isinstance(body.get("rules"), dict):
        raise invalid([FieldError("rules", "is required: an object of rules by name")])
    rules = parse_rules_document(body, frozenset({"rules"}))
    problems = Problems()
    for name, rule in rules.items():
        expired_quotas(rule.limits, f"rules.{name}.limits", problems)
    problems.raise_if_any()
    # Preconditions are weighed once the request is otherwise valid (RFC 9110, 13.2.1).
    why = conditions.existence_fails(True)  # the rules, as a whole, always exist
    if why is not None:
        raise PreconditionFailed(f"the rules always exist ({why})")
    version = await _publish(request, lambda _current: rules, conditions)
    listing = [rule.to_dict() for _, rule in sorted(rules.items())]
    return json_response({"version": version, "rules": listing}, headers=_etag(version))


async def get_rule(request: web.Request) -> web.Response:
    name = rule_name(request.match_info["name"])
    book = router_of(request).rules
    rule = book.get(name)
    if rule is None:
        raise UnknownRule(name, did_you_mean(name, book.rules))
    return json_response(rule.to_dict(), headers=_etag(book.version))


@admin_only
async def put_rule(request: web.Request) -> web.Response:
    name = rule_name(request.match_info["name"])
    conditions = preconditions(request.headers)
    body = await json_body(request)
    problems = Problems()
    rule = problems.result(parse_rule(name, body, "body", problems))
    expired_quotas(rule.limits, "body.limits", problems)
    problems.raise_if_any()
    created = False

    def upsert(current: dict[str, Rule]) -> dict[str, Rule]:
        nonlocal created
        _require(conditions, name, current)
        created = name not in current
        return {**current, name: rule}

    version = await _publish(request, upsert, conditions)
    return json_response(rule.to_dict(), status=201 if created else 200, headers=_etag(version))


@admin_only
async def delete_rule(request: web.Request) -> web.Response:
    name = rule_name(request.match_info["name"])
    conditions = preconditions(request.headers)

    def remove(current: dict[str, Rule]) -> dict[str, Rule]:
        _require(conditions, name, current)
        if name not in current:
            raise UnknownRule(name, did_you_mean(name, current))
        return {n: r for n, r in current.items() if n != name}

    version = await _publish(request, remove, conditions)
    return web.Response(status=204, headers=_etag(version))
