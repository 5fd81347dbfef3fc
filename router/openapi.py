"""The router's OpenAPI 3.1 document (served at /openapi.json)."""

from __future__ import annotations

import zoneinfo
from functools import cache
from typing import Any

from cluster.calendar import PERIODS, load_timezone
from cluster.keys import MAX_KEY_BYTES
from cluster.limits import (
    ALGORITHMS,
    MAX_AMOUNT_SCALE,
    MAX_COUNT,
    MAX_DURATION_MS,
    MAX_LIMITS_PER_RULE,
    MAX_SLIDING_LOG,
)
from router.requests import MAX_BATCH


def _upto(n: int) -> str:
    """A regex for the decimal integers 1..n (leading zeros allowed)."""
    digits = str(n)
    alternatives = [f"[1-9][0-9]{{0,{len(digits) - 2}}}"] if len(digits) > 1 else []
    for i, d in enumerate(digits):
        head, rest = digits[:i], len(digits) - i - 1
        low = 1 if i == 0 else 0
        if int(d) > low:
            tail = f"[0-9]{{{rest}}}" if rest else ""
            alternatives.append(f"{head}[{low}-{int(d) - 1}]{tail}")
    alternatives.append(digits)
    return f"0*(?:{'|'.join(alternatives)})"


_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
DURATION_PATTERN = (
    r"^\s*(?:"
    + "|".join(f"{_upto(MAX_DURATION_MS // ms)}\\s*{unit}" for unit, ms in _UNIT_MS.items())
    + r")\s*$"
)
_DURATION = {
    "anyOf": [
        {"type": "string", "pattern": DURATION_PATTERN},
        {"type": "integer", "minimum": 1, "maximum": MAX_DURATION_MS},
    ],
    "description": "'500ms', '1s', '1m', '1h', '1d' or milliseconds; from 1ms to 3660d",
}
_DIGITS = "[0-9](?:_?[0-9])*"
# What Python's Decimal reads, finite and not negative ("-0" is zero).
DECIMAL_PATTERN = (
    rf"^\s*(?:\+?(?:{_DIGITS}(?:\.(?:{_DIGITS})?)?|\.{_DIGITS})"
    r"|-(?:0(?:_?0)*(?:\.(?:0(?:_?0)*)?)?|\.0(?:_?0)*))"
    rf"(?:[eE][+-]?{_DIGITS})?\s*$"
)
_DECIMAL = {
    "anyOf": [
        {"type": "number", "minimum": 0},
        {"type": "string", "pattern": DECIMAL_PATTERN},
    ],
    "description": 'exact decimal, e.g. 12.30 or "12.30"',
}


@cache
def _timezones() -> list[str]:
    """Every IANA name load_timezone accepts (tzdata's, less host-dependent ones)."""
    names = []
    for name in sorted(zoneinfo.available_timezones()):
        try:
            load_timezone(name)
        except ValueError:
            continue
        names.append(name)
    return names


def _problem_ref() -> dict[str, Any]:
    return {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}


def _ci(word: str) -> str:
    return "".join(f"[{c}{c.upper()}]" if c.isalpha() else c for c in word)


# `limits`-style rate strings as cluster.limits.expand_rate_string reads them: a count
# of 1..MAX_COUNT per a window of at most 3660 days, in any letter case.
_RATE_UNIT_MS = {
    "second": 1000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000,
    "month": 30 * 86_400_000, "year": 365 * 86_400_000,
}  # fmt: skip
_WINDOW = "|".join(
    rf"(?:{_upto(MAX_DURATION_MS // ms)}\s*)?{_ci(unit)}" for unit, ms in _RATE_UNIT_MS.items()
)
_RATE = rf"\s*{_upto(MAX_COUNT)}\s*(?:/|{_ci('per')}\s)\s*(?:{_WINDOW})[sS]?\s*"
RATE_PATTERN = (
    rf"^\s*(?:(?:fixed_window|sliding_window)\s*:)?{_RATE}"
    rf"(?:[;,]{_RATE}){{0,{MAX_LIMITS_PER_RULE - 1}}}$"
)


def _given(name: str, other: str) -> dict[str, Any]:
    """`name` given (not null), `other` absent or null."""
    return {
        "required": [name],
        "properties": {
            name: {"not": {"type": "null"}},
            other: {"type": "null"},
        },
        **(
            {
                "properties": {
                    name: {"not": {"type": "null"}},
                    other: {"type": "null"},
                    "on_failure": {"enum": ["allow", "deny", None]},
                }
            }
            if name == "limits"
            else {}
        ),
    }


def _responses(ok: dict[str, Any], *statuses: int) -> dict[str, Any]:
    out = dict(ok)
    for status in statuses:
        out[str(status)] = {"description": "problem", "content": _problem_ref()}
    return out


def _json_body(ref: str) -> dict[str, Any]:
    return {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}},
    }


def _json_ok(ref: str, description: str = "ok", status: str = "200") -> dict[str, Any]:
    return {
        status: {
            "description": description,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}},
        }
    }


@cache
def openapi_document() -> dict[str, Any]:
    def count(maximum: int = MAX_COUNT) -> dict[str, Any]:
        return {"type": "integer", "minimum": 1, "maximum": maximum}

    def variant(algorithm: str, required: list[str], **props: Any) -> dict[str, Any]:
        return {
            "type": "object",
            "additionalProperties": False,
            "required": ["algorithm", *required],
            "properties": {"algorithm": {"type": "string", "const": algorithm}, **props},
        }

    windows = {
        name: variant(
            name,
            ["limit", "window"],
            limit=count(MAX_SLIDING_LOG if name == "sliding_log" else MAX_COUNT),
            window=_DURATION,
        )
        for name in ("fixed_window", "sliding_log", "sliding_window")
    }
    buckets = {
        name: variant(name, ["rate", "period"], rate=count(), period=_DURATION, **{size: count()})
        for name, size in (("token_bucket", "burst"), ("leaky_bucket", "capacity"))
    }
    calendar = variant(
        "calendar",
        ["period"],
        period={"type": "string", "enum": list(PERIODS)},
        timezone={"type": "string", "enum": _timezones(), "default": "UTC"},
        max_count={"anyOf": [count(), {"type": "null"}]},
        max_amount={"anyOf": [*_DECIMAL["anyOf"], {"type": "null"}]},
        amount_scale={"type": "integer", "minimum": 0, "maximum": MAX_AMOUNT_SCALE, "default": 2},
    )
    calendar["anyOf"] = [
        {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
        for name in ("max_count", "max_amount")
    ]
    calendar["description"] = "max_count, max_amount or both (not null)"
    variants = {**windows, **buckets, "calendar": calendar}
    assert set(variants) == set(ALGORITHMS)
    limit = {
        "description": "one limit; its fields depend on the algorithm. Not said here: a "
        "bucket's rate x period and size x period stay below 2**53, and max_amount has at "
        "most amount_scale decimal places and at most 10**15 minor units",
        "oneOf": [{"$ref": f"#/components/schemas/{name}"} for name in variants],
        "discriminator": {
            "propertyName": "algorithm",
            "mapping": {name: f"#/components/schemas/{name}" for name in variants},
        },
    }
    key = {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_KEY_BYTES,
        "description": f"at most {MAX_KEY_BYTES} bytes in UTF-8",
    }
    rule_name = {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,64}$"}
    check = {
        "type": "object",
        "additionalProperties": False,
        "required": ["key"],
        "description": "`rule` (a rule's name) or inline `limits`, not both (null counts as "
        "absent). The rule must exist; `on_failure` is read only with inline limits",
        "properties": {
            "key": key,
            "rule": {"type": ["string", "null"]},
            "limits": {"anyOf": [{"$ref": "#/components/schemas/Limits"}, {"type": "null"}]},
            "cost": {"type": "integer", "minimum": 0, "maximum": MAX_COUNT, "default": 1},
            "amount": _DECIMAL,
            "request_id": {
                "type": ["string", "null"],
                "pattern": r"^[A-Za-z0-9_.:@~+=/-]{1,128}$",
            },
            "dry_run": {"type": "boolean", "default": False},
            "on_failure": {"description": "'allow', 'deny' or null (with inline limits)"},
        },
        "oneOf": [_given("rule", "limits"), _given("limits", "rule")],
    }
    limit_state = {
        "type": "object",
        "required": ["algorithm", "limit", "remaining", "reset_after_ms"],
        "properties": {
            "algorithm": {"type": "string"},
            "limit": {"type": ["integer", "null"]},
            "remaining": {"type": ["integer", "null"]},
            "reset_after_ms": {"type": ["integer", "null"]},
            "delay_ms": {"type": ["integer", "null"]},
            "max_amount": {"type": ["string", "null"]},
            "amount_remaining": {"type": ["string", "null"]},
            "period": {"type": "string"},
            "timezone": {"type": "string"},
        },
    }
    decision = {
        "type": "object",
        "required": ["allowed", "key", "rule", "node", "retry_after_ms", "limits", "denied_by"],
        "properties": {
            "allowed": {"type": "boolean"},
            "key": {"type": "string"},
            "rule": {"type": ["string", "null"]},
            "node": {"type": "string"},
            "retry_after_ms": {"type": ["integer", "null"]},
            "limits": {"type": "array", "items": {"$ref": "#/components/schemas/LimitState"}},
            "denied_by": {"type": "array", "items": {"type": "integer"}},
            "replayed": {"type": "boolean"},
            "dry_run": {"type": "boolean"},
            "degraded": {"type": "boolean"},
            "rolled_back": {"type": "boolean"},
        },
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
            "name": {"type": ["string", "null"], "description": "the name in the path, or null"},
            "limits": {"$ref": "#/components/schemas/Limits"},
            "on_failure": {"enum": ["allow", "deny", None]},
        },
    }
    name_param = {
        "name": "name",
        "in": "path",
        "required": True,
        "schema": rule_name,
    }
    key_query = {"name": "key", "in": "query", "required": True, "schema": key}
    if_match = {
        "name": "If-Match",
        "in": "header",
        "required": False,
        "description": "the rules version the write is based on (the ETag of GET /v1/rules); "
        "409 when the cluster's rules are at another version",
        "schema": {"type": "string", "pattern": '^(W/)?"?[0-9]+"?$'},
    }
    admin: list[dict[str, list[str]]] = [{"admin": []}]
    paths: dict[str, Any] = {
        "/v1/check": {
            "post": {
                "summary": "One decision: 200 if allowed, 429 if denied (same body)",
                "requestBody": _json_body("Check"),
                "responses": _responses(
                    {**_json_ok("Decision", "allowed"), **_json_ok("Decision", "denied", "429")},
                    400,
                    409,
                    413,
                ),
            }
        },
        "/v1/check/batch": {
            "post": {
                "summary": f"Up to {MAX_BATCH} checks, results in order",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["checks"],
                                "properties": {
                                    "checks": {
                                        "type": "array",
                                        "minItems": 1,
                                        "maxItems": MAX_BATCH,
                                        "items": {"$ref": "#/components/schemas/Check"},
                                    },
                                    "all_or_nothing": {"type": "boolean"},
                                },
                            }
                        }
                    },
                },
                "responses": _responses(_json_ok("BatchResult"), 400, 409, 413),
            }
        },
        "/v1/refund": {
            "post": {
                "summary": "Give back what a decision consumed, once",
                "requestBody": _json_body("Refund"),
                "responses": _responses(_json_ok("RefundResult"), 400, 404, 409, 413, 503),
            }
        },
        "/v1/usage": {
            "get": {
                "summary": "Current state of a key under a rule; consumes nothing",
                "parameters": [
                    key_query,
                    {
                        "name": "rule",
                        "in": "query",
                        "required": True,
                        "description": "an existing rule's name",
                        "schema": {"type": "string"},
                    },
                ],
                "responses": _responses(_json_ok("Decision"), 400),
            }
        },
        "/v1/authz": {
            "get": {
                "summary": "Forward auth for gateways: 204 allowed, deny_status denied (no body)",
                "parameters": [
                    {"name": "rule", "in": "query", "required": True, "schema": {"type": "string"}},
                    {
                        "name": "key",
                        "in": "query",
                        "required": False,
                        "description": "the key; or key_header (one of them)",
                        "schema": key,
                    },
                    {
                        "name": "key_header",
                        "in": "query",
                        "required": False,
                        "description": "the request header holding the key (X-Forwarded-For: "
                        "its last entry)",
                        "schema": {"type": "string"},
                    },
                    {
                        "name": "cost",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "string", "pattern": "^[0-9]{1,13}$"},
                    },
                    {
                        "name": "deny_status",
                        "in": "query",
                        "required": False,
                        "schema": {"enum": ["429", "403", "401"]},
                    },
                ],
                "responses": {
                    "204": {"description": "allowed (RateLimit, RateLimit-Policy)"},
                    "429": {"description": "denied (Retry-After, RateLimit)"},
                    "403": {"description": "denied, deny_status=403"},
                    "401": {"description": "denied, deny_status=401"},
                    "400": {"description": "problem", "content": _problem_ref()},
                },
            }
        },
        "/v1/rules": {
            "get": {
                "summary": "All rules, with their cluster version (also the ETag)",
                "responses": _json_ok("RuleList"),
            },
            "put": {
                "summary": "Replace every rule at once (admin; `shardlimit rules apply`)",
                "security": admin,
                "parameters": [if_match],
                "requestBody": _json_body("RuleDocument"),
                "responses": _responses(_json_ok("RuleList", "stored"), 400, 401, 409, 413, 503),
            },
        },
        "/v1/rules/{name}": {
            "parameters": [name_param],
            "get": {"summary": "One rule", "responses": _responses(_json_ok("Rule"), 400, 404)},
            "put": {
                "summary": "Create or replace a rule (admin)",
                "security": admin,
                "parameters": [if_match],
                "requestBody": _json_body("Rule"),
                "responses": _responses(
                    {**_json_ok("Rule", "replaced"), **_json_ok("Rule", "created", "201")},
                    400,
                    401,
                    409,
                    413,
                    503,
                ),
            },
            "delete": {
                "summary": "Delete a rule (admin)",
                "security": admin,
                "parameters": [if_match],
                "responses": _responses(
                    {"204": {"description": "deleted"}}, 400, 401, 404, 409, 503
                ),
            },
        },
        "/v1/cluster": {
            "get": {"summary": "Topology and node state", "responses": _json_ok("Cluster")}
        },
        "/v1/locate": {
            "get": {
                "summary": "Which node (and slot or ring point) owns a key",
                "parameters": [key_query],
                "responses": _responses(_json_ok("Location"), 400),
            }
        },
        "/healthz": {
            "get": {"summary": "Process is alive", "responses": {"200": {"description": "ok"}}}
        },
        "/readyz": {
            "get": {
                "summary": "All nodes reachable",
                "responses": {"200": {"description": "ready"}, "503": {"description": "degraded"}},
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {"200": {"description": "text exposition"}},
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This document",
                "responses": {"200": {"description": "OpenAPI 3.1"}},
            }
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "shardlimit router", "version": "1"},
        "paths": paths,
        "components": {
            "securitySchemes": {"admin": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Limit": limit,
                **variants,
                "Limits": {
                    "description": "limit objects, or `limits`-style rate strings that stand "
                    "for fixed windows ('10/second;1000/day', '500/7 days'; "
                    "'sliding_window: 10/minute' for sliding ones)",
                    "anyOf": [
                        {
                            "type": "array",
                            "minItems": 1,
                            "maxItems": 16,
                            "items": {
                                "anyOf": [
                                    {"$ref": "#/components/schemas/Limit"},
                                    {"type": "string", "pattern": RATE_PATTERN},
                                ]
                            },
                        },
                        {"type": "string", "pattern": RATE_PATTERN},
                    ],
                },
                "Check": check,
                "LimitState": limit_state,
                "Decision": decision,
                "Problem": problem,
                "Rule": rule,
                "RuleList": {
                    "type": "object",
                    "required": ["version", "rules"],
                    "properties": {
                        "version": {"type": "integer", "minimum": 0},
                        "rules": {"type": "array", "items": rule},
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
                "BatchResult": {
                    "type": "object",
                    "required": ["allowed", "results"],
                    "properties": {
                        "allowed": {"type": "boolean"},
                        "results": {
                            "type": "array",
                            "items": {"$ref": "#/components/schemas/Decision"},
                        },
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
                            "anyOf": [{"$ref": "#/components/schemas/Limits"}, {"type": "null"}]
                        },
                        "request_id": {
                            "type": "string",
                            "pattern": r"^[A-Za-z0-9_.:@~+=/-]{1,128}$",
                        },
                    },
                    "oneOf": [_given("rule", "limits"), _given("limits", "rule")],
                },
                "RefundResult": {
                    "type": "object",
                    "required": ["refunded", "key", "given_back"],
                    "properties": {
                        "refunded": {"type": "boolean"},
                        "key": {"type": "string"},
                        "rule": {"type": ["string", "null"]},
                        "request_id": {"type": "string"},
                        "given_back": {"type": "array", "items": {"type": "object"}},
                        "detail": {"type": ["string", "null"]},
                    },
                },
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
            },
        },
    }
