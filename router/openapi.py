"""The router's OpenAPI 3.1 document (served at /openapi.json)."""

from __future__ import annotations

from functools import cache
from typing import Any

from cluster.limits import ALGORITHMS, MAX_COUNT
from router.requests import MAX_BATCH

_DURATION = {
    "oneOf": [
        {"type": "string", "pattern": r"^\s*\d+\s*(ms|s|m|h|d)\s*$"},
        {"type": "integer", "minimum": 1},
    ],
    "description": "'500ms', '1s', '1m', '1h', '1d' or milliseconds",
}
_DECIMAL = {
    "oneOf": [{"type": "number", "minimum": 0}, {"type": "string"}],
    "description": 'exact decimal, e.g. 12.30 or "12.30"',
}


def _problem_ref() -> dict[str, Any]:
    return {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}


_RATE = r"[0-9]+ *(/|per ) *([0-9]+ *)?(second|minute|hour|day|month|year)s? *"
RATE_PATTERN = rf"^ *((fixed_window|sliding_window) *: *)?{_RATE}([;,] *{_RATE})*$"


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
    limit = {
        "type": "object",
        "required": ["algorithm"],
        "properties": {
            "algorithm": {"type": "string", "enum": list(ALGORITHMS)},
            "limit": {"type": "integer", "minimum": 1},
            "window": _DURATION,
            "rate": {"type": "integer", "minimum": 1},
            "period": {"oneOf": [_DURATION, {"type": "string"}]},
            "burst": {"type": "integer", "minimum": 1},
            "capacity": {"type": "integer", "minimum": 1},
            "timezone": {"type": "string"},
            "max_count": {"type": ["integer", "null"], "minimum": 1},
            "max_amount": {"oneOf": [*_DECIMAL["oneOf"], {"type": "null"}]},
            "amount_scale": {"type": "integer", "minimum": 0, "maximum": 6},
        },
    }
    check = {
        "type": "object",
        "additionalProperties": False,
        "required": ["key"],
        "properties": {
            "key": {"type": "string", "minLength": 1, "description": "at most 512 bytes"},
            "rule": {"type": "string"},
            "limits": {"$ref": "#/components/schemas/Limits"},
            "cost": {"type": "integer", "minimum": 0, "maximum": MAX_COUNT, "default": 1},
            "amount": _DECIMAL,
            "request_id": {
                "type": ["string", "null"],
                "pattern": r"^[A-Za-z0-9_.:@~+=/-]{1,128}$",
            },
            "dry_run": {"type": "boolean", "default": False},
            "on_failure": {"enum": ["allow", "deny", None]},
        },
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
            "name": {"type": ["string", "null"]},
            "limits": {"$ref": "#/components/schemas/Limits"},
            "on_failure": {"enum": ["allow", "deny", None]},
        },
    }
    name_param = {
        "name": "name",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,64}$"},
    }
    key_query = {"name": "key", "in": "query", "required": True, "schema": {"type": "string"}}
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
                    {"name": "rule", "in": "query", "required": True, "schema": {"type": "string"}},
                ],
                "responses": _responses(_json_ok("Decision"), 400),
            }
        },
        "/v1/authz": {
            "get": {
                "summary": "Forward auth for gateways: 204 allowed, deny_status denied (no body)",
                "parameters": [
                    {"name": "rule", "in": "query", "required": True, "schema": {"type": "string"}},
                    {"name": "key", "in": "query", "required": False, "schema": {"type": "string"}},
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
                        "key": {"type": "string"},
                        "rule": {"type": "string"},
                        "limits": {"$ref": "#/components/schemas/Limits"},
                        "request_id": {"type": "string"},
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
