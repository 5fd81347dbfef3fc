"""Request bodies and the other schemas of the document. The answers (decisions, refunds,
quota adjustments) are not written here: they are generated from the msgspec Structs in
cluster/model/answers.py that the router encodes and the SDK decodes."""

from __future__ import annotations

from typing import Any

import msgspec

from cluster.model import answers
from cluster.model.keys import MAX_KEY_BYTES
from cluster.model.lease_ids import LEASE_ID_PATTERN
from cluster.model.limits import (
    MAX_COUNT,
    MAX_LEASE_MS,
    MAX_LIMITS_PER_RULE,
)
from router.api.openapi.limit_schemas import (
    NAMED_ONLY,
    limit_of,
    limit_variants,
    limits_of,
)
from router.api.openapi.patterns import (
    DECIMAL,
    REQUEST_ID_PATTERN,
    RULE_NAME_PATTERN,
    SIGNED_DECIMAL,
    duration_schema,
)
from router.rules.rejection import FILE_BLOCK_SCHEMA
from router.rules.spread_split import MAX_SPREAD

REF = "#/components/schemas/{name}"
KEY: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_KEY_BYTES,
    "description": f"at most {MAX_KEY_BYTES} bytes in UTF-8",
}
RULE_NAME_SCHEMA: dict[str, Any] = {"type": "string", "pattern": RULE_NAME_PATTERN}


def _rule_or_limits(*, on_failure: bool) -> dict[str, Any]:
    """`rule` (a name) or inline `limits`, exactly one given (null counts as absent); with
    limits, `on_failure` and `durability` (when asked for) are an enum or null, and beside a
    rule only null. if/then/else, not oneOf: generated clients (openapi-python-client) keep
    one model with every field."""
    limits_given: dict[str, Any] = {"limits": {"not": {"type": "null"}}}
    rule_given: dict[str, Any] = {"limits": {"type": "null"}}
    if on_failure:
        limits_given["on_failure"] = {"enum": ["allow", "deny", None]}
        limits_given["durability"] = {"enum": ["primary", "replica", None]}
        rule_given["on_failure"] = rule_given["durability"] = {"type": "null"}
    return {
        "if": {"required": ["rule"], "properties": {"rule": {"type": "string"}}},
        "then": {"properties": rule_given},
        "else": {"required": ["limits"], "properties": limits_given},
    }


def _at_least_one(first: str, *others: str) -> dict[str, Any]:
    """At least one of these properties present."""
    if not others:
        return {"required": [first]}
    return {"if": {"required": [first]}, "else": _at_least_one(*others)}


def _lease_body(key: dict[str, Any], rule_name: dict[str, Any], renew: bool) -> dict[str, Any]:
    """POST /v1/lease/renew's or /v1/lease/release's body (router/decide/leases.py)."""
    properties = {
        "key": key,
        "rule": rule_name,
        "lease_id": {"type": "string", "pattern": LEASE_ID_PATTERN},
    }
    if renew:
        ttl = duration_schema(MAX_LEASE_MS)
        properties["ttl"] = {**ttl, "description": "default: the limit's lease; from now"}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["key", "rule", "lease_id"],
        "description": "Not said here (a schema cannot): the rule exists and has a "
        "concurrency limit; lease_id is as its check's decision gave it",
        "properties": properties,
    }


def _quota_adjust(key: dict[str, Any], rule_name: dict[str, Any]) -> dict[str, Any]:
    """POST /v1/quota/adjust's body (router/decide/quota_adjust.py)."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["key", "rule", "request_id"],
        "description": "delta or set (the count), delta_amount or set_amount (the amount), "
        "one of each pair at most, one at least. Not said here (a schema cannot): the rule "
        "exists and has a quota limit with a limit (for delta/set) and a max_amount (for "
        "delta_amount/set_amount); amounts have at most its amount_scale decimal places "
        "and at most 10**15 minor units",
        "properties": {
            "key": key,
            "rule": rule_name,
            "request_id": {"type": "string", "pattern": REQUEST_ID_PATTERN},
            "delta": {"type": "integer", "minimum": -MAX_COUNT, "maximum": MAX_COUNT},
            "set": {"type": "integer", "minimum": 0, "maximum": MAX_COUNT},
            "delta_amount": SIGNED_DECIMAL,
            "set_amount": DECIMAL,
        },
        # nested if/else, not anyOf: openapi-python-client makes `Any` of an object anyOf
        **_at_least_one("delta", "set", "delta_amount", "set_amount"),
        "not": {
            "anyOf": [{"required": ["delta", "set"]}, {"required": ["delta_amount", "set_amount"]}]
        },
    }


def answer_schemas() -> dict[str, Any]:
    """The answers' schemas, from the Structs the router encodes."""
    _, schemas = msgspec.json.schema_components(answers.ANSWERS, ref_template=REF)
    return schemas


def components() -> dict[str, Any]:
    """Every schema of the document, by name."""
    key = KEY
    rule_name = RULE_NAME_SCHEMA
    variants = limit_variants()
    about_limit = (
        "one limit; its fields depend on the algorithm. Not said here (a "
        "schema cannot): max_amount's bounds depend on amount_scale, and a quota's "
        "expires_at must be a real date in the future"
    )
    limit = limit_of(list(variants), about_limit)
    inline = [name for name in variants if name not in NAMED_ONLY]
    about_limits = (
        "limit objects, or `limits`-style rate strings that stand "
        "for fixed windows ('10/second;1000/day', '500/7 days'; "
        "'sliding_window: 10/minute' for sliding ones). Not said here (a schema "
        f"cannot): at most {MAX_LIMITS_PER_RULE} limits once rate strings expand, "
        "and no two that count the same counter (same algorithm and "
        "window/period; one quota, one concurrency limit)"
    )
    check = {
        "type": "object",
        "additionalProperties": False,
        "required": ["key"],
        "description": "`rule` (a rule's name) or inline `limits`, not both (null counts as "
        "absent). The rule must exist; `on_failure` and `durability` are read only with inline "
        "limits",
        "properties": {
            "key": key,
            "rule": {"type": ["string", "null"]},
            "limits": {"anyOf": [{"$ref": "#/components/schemas/InlineLimits"}, {"type": "null"}]},
            "cost": {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_COUNT,
                "default": 1,
                "description": "written as an integer (1, not 1.0, which JSON Schema counts "
                "as one and this API refuses); 0 or 1 for a rule with a concurrency limit: "
                "one lease a check",
            },
            "amount": DECIMAL,
            "request_id": {
                "type": ["string", "null"],
                "pattern": REQUEST_ID_PATTERN,
            },
            "dry_run": {"type": "boolean", "default": False},
            "on_failure": {"description": "'allow', 'deny' or null (with inline limits)"},
            "durability": {
                "description": "'primary', 'replica' or null (with inline limits): on a "
                "shard with replicas, `replica` is acknowledged only once a replica holds it"
            },
        },
        **_rule_or_limits(on_failure=True),
    }
    problem = {
        "type": "object",
        "required": ["type", "title", "status", "detail"],
        "properties": {
            "type": {"type": "string"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
            "errors": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["field", "message"],
                    "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
                },
            },
        },
    }
    rule = {
        "type": "object",
        "additionalProperties": False,
        "required": ["limits"],
        "properties": {
            "name": {
                "type": ["string", "null"],
                "description": "the rule's own name (in the path, or its key in a rules "
                "document), or null",
            },
            "limits": {"$ref": "#/components/schemas/Limits"},
            "on_failure": {"enum": ["allow", "deny", None]},
            "spread": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_SPREAD,
                "description": "split each key's budget over this many sub-counters `key#i` "
                "(1: not spread). Not said here (a schema cannot): at most every limit's "
                "limit, rate and max_amount in minor units, and no concurrency limit",
            },
            "cache_denials": {
                "type": "boolean",
                "description": "answer a used-up key on the router until its quota returns, "
                "without a node call (a refund through another router shows after that). "
                "Not said here (a schema cannot): not with a concurrency limit",
            },
            "durability": {
                "enum": ["primary", "replica", None],
                "description": "replica: a check is acknowledged only once a replica of its "
                "shard holds it (never lost to a failover; answered degraded, consuming "
                "nothing, when no replica acknowledges in time); default (null or absent) "
                "replica for rules with a calendar or quota limit, primary otherwise",
            },
            "shadow": {
                "type": "boolean",
                "description": "decide and count as usual, but answer a denial as allowed "
                "(`shadow: true` in the decision): to try a rule on live traffic",
            },
        },
    }
    return {
        "Limit": limit,
        **variants,
        "Limits": limits_of("Limit", about_limits),
        "InlineLimit": limit_of(inline, about_limit),
        "InlineLimits": limits_of("InlineLimit", about_limits),
        "Check": check,
        "Problem": problem,
        "Rule": rule,
        "RuleList": {
            "type": "object",
            "required": ["version", "rules"],
            "properties": {
                "version": {"type": "integer", "minimum": 0},
                "rules": {"type": "array", "items": rule},
                "file": FILE_BLOCK_SCHEMA,
            },
        },
        "RuleDocument": {
            "type": "object",
            "required": ["rules"],
            "additionalProperties": False,
            "properties": {
                "rules": {
                    "type": "object",
                    "propertyNames": rule_name,
                    "additionalProperties": {"$ref": "#/components/schemas/Rule"},
                }
            },
        },
        "Refund": {
            "type": "object",
            "additionalProperties": False,
            "required": ["key", "request_id"],
            "properties": {
                "key": key,
                "rule": {"type": ["string", "null"]},
                "limits": {
                    "anyOf": [{"$ref": "#/components/schemas/InlineLimits"}, {"type": "null"}]
                },
                "request_id": {
                    "type": "string",
                    "pattern": REQUEST_ID_PATTERN,
                },
            },
            **_rule_or_limits(on_failure=False),
        },
        "QuotaAdjust": _quota_adjust(key, rule_name),
        "LeaseRenew": _lease_body(key, rule_name, renew=True),
        "LeaseRelease": _lease_body(key, rule_name, renew=False),
        "Cluster": {
            "type": "object",
            "required": ["epoch", "partitioner", "nodes", "migration"],
            "properties": {
                "epoch": {"type": "integer"},
                "partitioner": {"type": "string", "enum": ["ring", "slots"]},
                "nodes": {"type": "array", "items": {"type": "object"}},
                "migration": {"type": ["object", "null"]},
            },
        },
        "Location": {
            "type": "object",
            "required": ["key", "node"],
            "properties": {
                "key": {"type": "string"},
                "node": {"type": "string"},
                "slot": {"type": "integer"},
                "point": {"type": "integer"},
            },
        },
        **answer_schemas(),
    }
