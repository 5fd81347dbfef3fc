"""The router's OpenAPI 3.1 document (served at /openapi.json)."""

from __future__ import annotations

import re
import zoneinfo
from functools import cache
from typing import Any

from cluster.model.calendar import PERIODS, load_timezone
from cluster.model.keys import MAX_KEY_BYTES
from cluster.model.limits import (
    ALGORITHMS,
    MAX_AMOUNT_SCALE,
    MAX_BUCKET_PERIOD_MS,
    MAX_BUCKET_SIZE,
    MAX_COUNT,
    MAX_DURATION_MS,
    MAX_LIMITS_PER_RULE,
    MAX_SLIDING_LOG,
    SPACES,
    format_duration,
)
from router.requests import IF_MATCH, MAX_BATCH
from router.spread_split import MAX_SPREAD

# The patterns below read white space and digits as the server's parsers do (ASCII only,
# cluster.model.limits.SPACES) and hold in ECMA 262 and Python alike (no \s, \d or \Z).
_SPACE = SPACES.removesuffix("*")


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


def duration_pattern(maximum_ms: int) -> str:
    """Duration strings of 1ms..maximum_ms as cluster.model.limits.parse_duration reads them."""
    units = "|".join(
        f"{_upto(maximum_ms // ms)}{SPACES}{unit}"
        for unit, ms in _UNIT_MS.items()
        if maximum_ms >= ms
    )
    return f"^{SPACES}(?:{units}){SPACES}$"


def _duration(maximum_ms: int) -> dict[str, Any]:
    return {
        "anyOf": [
            {"type": "string", "pattern": duration_pattern(maximum_ms)},
            {"type": "integer", "minimum": 1, "maximum": maximum_ms},
        ],
        "description": "'500ms', '1s', '1m', '1h', '1d' or milliseconds; from 1ms to "
        + format_duration(maximum_ms),
    }


_DURATION = _duration(MAX_DURATION_MS)
# cluster.model.limits.DECIMAL_TEXT, finite and not negative ("-0" is zero).
_MANTISSA = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
DECIMAL_PATTERN = (
    rf"^{SPACES}(?:\+?{_MANTISSA}|-(?:0+(?:\.0*)?|\.0+))(?:[eE][+-]?[0-9]{{1,17}})?{SPACES}$"
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


def timezone_pattern() -> str:
    """The names _timezones() lists, as one pattern: as exact as an enum, and
    schemathesis's coverage phase does not send one request per name (~600 each time)."""
    names = "|".join(re.sub(r"([+.])", r"\\\1", name) for name in _timezones())
    return f"^(?:{names})$"


def _problem_ref() -> dict[str, Any]:
    return {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}


def _ci(word: str) -> str:
    return "".join(f"[{c}{c.upper()}]" if c.isalpha() else c for c in word)


# `limits`-style rate strings as cluster.model.limits.expand_rate_string reads them: a count
# of 1..MAX_COUNT per a window of at most 3660 days, in any letter case.
_RATE_UNIT_MS = {
    "second": 1000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000,
    "month": 30 * 86_400_000, "year": 365 * 86_400_000,
}  # fmt: skip
_WINDOW = "|".join(
    rf"(?:{_upto(MAX_DURATION_MS // ms)}{SPACES})?{_ci(unit)}" for unit, ms in _RATE_UNIT_MS.items()
)
_RATE = (
    rf"{SPACES}{_upto(MAX_COUNT)}{SPACES}(?:/|{_ci('per')}{_SPACE}){SPACES}(?:{_WINDOW})[sS]?"
    + SPACES
)
RATE_PATTERN = (
    rf"^{SPACES}(?:(?:fixed_window|sliding_window){SPACES}:)?{_RATE}"
    rf"(?:[;,]{_RATE}){{0,{MAX_LIMITS_PER_RULE - 1}}}$"
)


def _rule_or_limits(*, on_failure: bool) -> dict[str, Any]:
    """`rule` (a name) or inline `limits`, exactly one given (null counts as absent); with
    limits, `on_failure` (when asked for) is 'allow', 'deny' or null. if/then/else, not
    oneOf: generated clients (openapi-python-client) keep one model with every field."""
    limits_given: dict[str, Any] = {"limits": {"not": {"type": "null"}}}
    if on_failure:
        limits_given["on_failure"] = {"enum": ["allow", "deny", None]}
    return {
        "if": {"required": ["rule"], "properties": {"rule": {"type": "string"}}},
        "then": {"properties": {"limits": {"type": "null"}}},
        "else": {"required": ["limits"], "properties": limits_given},
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


def _count(maximum: int = MAX_COUNT) -> dict[str, Any]:
    return {"type": "integer", "minimum": 1, "maximum": maximum}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [*schema.get("anyOf", [schema]), {"type": "null"}]}


def _one_or_both(first: str, second: str) -> dict[str, Any]:
    """`first`, `second` or both given, not null (if/else rather than anyOf, as in
    _rule_or_limits)."""
    given = {
        name: {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
        for name in (first, second)
    }
    return {"if": given[first], "else": given[second]}


# An RFC 3339 date-time with an offset, fields in range (cluster.model.limits.parse_timestamp).
TIMESTAMP_PATTERN = (
    "^[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])[Tt]"
    "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:[.][0-9]{1,9})?"
    "(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])$"
)


def _windowed(algorithm: str) -> dict[str, Any]:
    maximum = MAX_SLIDING_LOG if algorithm == "sliding_log" else MAX_COUNT
    return _variant(algorithm, ["limit", "window"], limit=_count(maximum), window=_DURATION)


def _bucket(algorithm: str) -> dict[str, Any]:
    # Bounded field by field so that rate x period stays below 2**53 (cluster.model.limits).
    size = "burst" if algorithm == "token_bucket" else "capacity"
    return _variant(
        algorithm,
        ["rate", "period"],
        rate=_count(MAX_BUCKET_SIZE),
        period=_duration(MAX_BUCKET_PERIOD_MS),
        **{size: {**_count(MAX_BUCKET_SIZE), "description": "default: rate"}},
    )


_SCALE = {"type": "integer", "minimum": 0, "maximum": MAX_AMOUNT_SCALE, "default": 2}
_MAX_AMOUNT = {
    **_nullable(_DECIMAL),
    "description": "greater than zero, at most amount_scale decimal places and at most "
    "10**15 minor units",
}


def _calendar(algorithm: str) -> dict[str, Any]:
    schema = _variant(
        algorithm,
        ["period"],
        period={"type": "string", "enum": list(PERIODS)},
        timezone={
            "type": "string",
            "pattern": timezone_pattern(),
            "default": "UTC",
            "description": "an IANA name: the pattern lists every one the server loads",
        },
        max_count=_nullable(_count()),
        max_amount=_MAX_AMOUNT,
        amount_scale=_SCALE,
    )
    schema.update(_one_or_both("max_count", "max_amount"))
    schema["description"] = "max_count, max_amount or both (not null)"
    return schema


def _quota(algorithm: str) -> dict[str, Any]:
    schema = _variant(
        algorithm,
        [],
        limit=_nullable(_count()),
        max_amount=_MAX_AMOUNT,
        amount_scale=_SCALE,
        expires_at=_nullable(
            {
                "type": "string",
                "pattern": TIMESTAMP_PATTERN,
                "description": "RFC 3339 with an offset; a real date, in the future",
            }
        ),
    )
    schema.update(_one_or_both("limit", "max_amount"))
    schema["description"] = "limit, max_amount or both (not null); no window"
    return schema


def _variant(algorithm: str, required: list[str], **props: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["algorithm", *required],
        "properties": {"algorithm": {"type": "string", "const": algorithm}, **props},
    }


# The parameters of each algorithm of cluster/model/algorithms.py (what
# cluster.model.limits.parse_limit reads); an algorithm missing here fails
# tests/integration/test_openapi.py.
_PARAMETERS = {
    "fixed_window": _windowed,
    "sliding_log": _windowed,
    "sliding_window": _windowed,
    "token_bucket": _bucket,
    "leaky_bucket": _bucket,
    "calendar": _calendar,
    "quota": _quota,
}


def _limit_variants() -> dict[str, dict[str, Any]]:
    """One schema per algorithm, in cluster/model/algorithms.py's order."""
    return {name: _PARAMETERS[name](name) for name in ALGORITHMS if name in _PARAMETERS}


_SIGNED_DECIMAL = {
    "anyOf": [
        {"type": "number"},
        {
            "type": "string",
            "pattern": rf"^{SPACES}[+-]?{_MANTISSA}(?:[eE][+-]?[0-9]{{1,17}})?{SPACES}$",
        },
    ],
    "description": 'exact decimal, may be negative, e.g. -12.30 or "-12.30"',
}


def _at_least_one(first: str, *others: str) -> dict[str, Any]:
    """At least one of these properties present."""
    if not others:
        return {"required": [first]}
    return {"if": {"required": [first]}, "else": _at_least_one(*others)}


def _quota_adjust(key: dict[str, Any], rule_name: dict[str, Any]) -> dict[str, Any]:
    """POST /v1/quota/adjust's body (router/quota_adjust.py)."""
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
            "request_id": {"type": "string", "pattern": r"^[A-Za-z0-9_.:@~+=/-]{1,128}$"},
            "delta": {"type": "integer", "minimum": -MAX_COUNT, "maximum": MAX_COUNT},
            "set": {"type": "integer", "minimum": 0, "maximum": MAX_COUNT},
            "delta_amount": _SIGNED_DECIMAL,
            "set_amount": _DECIMAL,
        },
        # nested if/else, not anyOf: openapi-python-client makes `Any` of an object anyOf
        **_at_least_one("delta", "set", "delta_amount", "set_amount"),
        "not": {
            "anyOf": [{"required": ["delta", "set"]}, {"required": ["delta_amount", "set_amount"]}]
        },
    }


@cache
def openapi_document() -> dict[str, Any]:
    variants = _limit_variants()
    limit = {
        "description": "one limit; its fields depend on the algorithm. Not said here (a "
        "schema cannot): max_amount's bounds depend on amount_scale, and a quota's "
        "expires_at must be a real date in the future",
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
        **_rule_or_limits(on_failure=True),
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
            "shadow": {
                "type": "boolean",
                "description": "the rule is in shadow mode and denied: answered as allowed",
            },
            "cached": {
                "type": "boolean",
                "description": "answered by the router's denial cache (`cache_denials`)",
            },
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
            "spread": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_SPREAD,
                "description": "split each key's budget over this many sub-counters `key#i` "
                "(1: not spread). Not said here (a schema cannot): at most every limit's "
                "limit, rate and max_amount in minor units",
            },
            "cache_denials": {
                "type": "boolean",
                "description": "answer a used-up key on the router until its quota returns, "
                "without a node call (a refund through another router shows after that)",
            },
            "shadow": {
                "type": "boolean",
                "description": "decide and count as usual, but answer a denial as allowed "
                "(`shadow: true` in the decision): to try a rule on live traffic",
            },
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
        "schema": {"type": "string", "pattern": f"^{IF_MATCH.pattern}$"},
    }
    ring_layout = {  # router/ring_view.py: ring mode fills points/vnodes, slots mode slots/ranges
        "type": "object",
        "additionalProperties": False,
        "required": ["epoch", "partitioner", "vnodes", "nodes", "ranges"],
        "properties": {
            "epoch": {"type": "integer", "minimum": 1},
            "partitioner": {"enum": ["ring", "slots"]},
            "vnodes": {"type": ["integer", "null"], "minimum": 1},
            "nodes": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["id", "points", "slots"],
                    "properties": {
                        "id": {"type": "string"},
                        "points": {
                            "type": ["array", "null"],
                            "items": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
                        },
                        "slots": {"type": ["integer", "null"], "minimum": 0},
                    },
                },
            },
            "ranges": {
                "type": ["array", "null"],
                "items": {
                    "type": "array",
                    "minItems": 3,
                    "maxItems": 3,
                    # [first slot, last slot, node id]; not prefixItems, which schemathesis
                    # turns into an `items` list that its own validator then refuses
                    "items": {
                        "anyOf": [
                            {"type": "integer", "minimum": 0, "maximum": 16383},
                            {"type": "string"},
                        ]
                    },
                },
            },
        },
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
        "/v1/quota/adjust": {
            "post": {
                "summary": "Restock a quota key or set what it has left (admin), once per "
                "request_id",
                "security": admin,
                "requestBody": _json_body("QuotaAdjust"),
                "responses": _responses(_json_ok("QuotaAdjusted"), 400, 401, 409, 413, 503),
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
                        "description": f"0 to {MAX_COUNT}; default 1",
                        "schema": {"type": "string", "pattern": f"^(?:0+|{_upto(MAX_COUNT)})$"},
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
        "/v1/cluster/ring": {
            "get": {
                "summary": "The layout drawn by /ui: ring points in [0, 1) or slot ranges",
                "responses": {
                    "200": {
                        "description": "ok",
                        "content": {"application/json": {"schema": ring_layout}},
                    }
                },
            }
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
                    "'sliding_window: 10/minute' for sliding ones). Not said here (a schema "
                    f"cannot): at most {MAX_LIMITS_PER_RULE} limits once rate strings expand, "
                    "and no two that count the same counter (same algorithm and "
                    "window/period; one quota)",
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
                    **_rule_or_limits(on_failure=False),
                },
                "QuotaAdjust": _quota_adjust(key, rule_name),
                "QuotaAdjusted": {
                    "type": "object",
                    "required": ["key", "rule", "request_id", "replayed", "limit", "remaining"],
                    "properties": {
                        "key": {"type": "string"},
                        "rule": {"type": "string"},
                        "request_id": {"type": "string"},
                        "replayed": {"type": "boolean"},
                        "limit": {"type": ["integer", "null"]},
                        "remaining": {"type": ["integer", "null"]},
                        "max_amount": {"type": ["string", "null"]},
                        "amount_remaining": {"type": ["string", "null"]},
                        "reset_after_ms": {"type": ["integer", "null"]},
                    },
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
