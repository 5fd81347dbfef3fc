"""The document's endpoints: what each takes and answers."""

from __future__ import annotations

from typing import Any

from cluster.model.limits import MAX_COUNT, MAX_SLIDING_LOG
from router.api.if_match import IF_MATCH
from router.api.node_body import NODE_URL_PATTERN
from router.api.openapi.patterns import RULE_NAME_PATTERN, upto
from router.api.openapi.schemas import KEY, RULE_NAME_SCHEMA
from router.requests import MAX_BATCH


def _problem_ref() -> dict[str, Any]:
    return {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}


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


NEW_NODE: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["url"],
    "properties": {
        "url": {"type": "string", "pattern": NODE_URL_PATTERN, "description": "a running node"},
        "id": {"type": "string", "pattern": RULE_NAME_PATTERN, "description": "default: nN"},
        "weight": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 1},
        "dry_run": {"type": "boolean", "default": False},
    },
}


def paths() -> dict[str, Any]:
    key = KEY
    rule_name = RULE_NAME_SCHEMA
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
        "description": "the rules versions the write may be based on (the ETag of GET "
        "/v1/rules), 409 when the cluster's rules are at another; or *: the rule written "
        "must exist, 412 when it does not",
        "schema": {"type": "string", "pattern": f"^(?:{IF_MATCH.pattern})$"},
    }
    if_none_match = {
        "name": "If-None-Match",
        "in": "header",
        "required": False,
        "description": "*: the rule written must not exist yet (create only), 412 when it "
        "does; or rules versions the write may not be based on, 409 when it is",
        "schema": {"type": "string", "pattern": f"^(?:{IF_MATCH.pattern})$"},
    }
    # router/api/ring_view.py: ring mode fills points/vnodes, slots mode slots/ranges
    ring_layout = {
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
    return {
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
                                        "description": "the checks on sliding_log limits "
                                        "that may be admitted (cost within each such limit, "
                                        "not dry runs) add up to a cost of "
                                        f"{MAX_SLIDING_LOG} at most",
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
                "responses": _responses(_json_ok("BatchResult"), 400, 413),
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
        "/v1/lease/renew": {
            "post": {
                "summary": "Renew a held lease of a concurrency limit: it now expires ttl "
                "(default: the limit's lease) from now; 404 lease-not-found once not held",
                "requestBody": _json_body("LeaseRenew"),
                "responses": _responses(_json_ok("LeaseRenewed"), 400, 404, 413, 503),
            }
        },
        "/v1/lease/release": {
            "post": {
                "summary": "Release a held lease of a concurrency limit, freeing its slot; "
                "404 lease-not-found when it was not held",
                "requestBody": _json_body("LeaseRelease"),
                "responses": _responses(_json_ok("LeaseReleased"), 400, 404, 413, 503),
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
                        "schema": rule_name,
                    },
                ],
                "responses": _responses(_json_ok("Decision"), 400),
            }
        },
        "/v1/authz": {
            "get": {
                "summary": "Forward auth for gateways: 204 allowed, deny_status denied (no body)",
                "parameters": [
                    {
                        "name": "rule",
                        "in": "query",
                        "required": True,
                        "description": "an existing rule's name",
                        "schema": rule_name,
                    },
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
                        "schema": {"type": "string", "pattern": f"^(?:0+|{upto(MAX_COUNT)})$"},
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
                "parameters": [if_match, if_none_match],
                "requestBody": _json_body("RuleDocument"),
                "responses": _responses(
                    _json_ok("RuleList", "stored"), 400, 401, 409, 412, 413, 503
                ),
            },
        },
        "/v1/rules/{name}": {
            "parameters": [name_param],
            "get": {"summary": "One rule", "responses": _responses(_json_ok("Rule"), 400, 404)},
            "put": {
                "summary": "Create or replace a rule (admin)",
                "security": admin,
                "parameters": [if_match, if_none_match],
                "requestBody": _json_body("Rule"),
                "responses": _responses(
                    {**_json_ok("Rule", "replaced"), **_json_ok("Rule", "created", "201")},
                    400,
                    401,
                    409,
                    412,
                    413,
                    503,
                ),
            },
            "delete": {
                "summary": "Delete a rule (admin)",
                "security": admin,
                "parameters": [if_match, if_none_match],
                "responses": _responses(
                    {"204": {"description": "deleted"}}, 400, 401, 404, 409, 412, 503
                ),
            },
        },
        "/v1/cluster/nodes": {
            "post": {
                "summary": "Add a node and move the keys it now owns (admin); 202 once the "
                "migration started",
                "security": admin,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": NEW_NODE}},
                },
                "responses": _responses(
                    {
                        "200": {
                            "description": "dry_run: the planned moves, and `refused`: null, "
                            "or the problem (status, type, detail) adding the node now "
                            "would answer"
                        },
                        "202": {"description": "migration started"},
                    },
                    400,
                    401,
                    409,
                    413,
                    422,
                    503,
                ),
            }
        },
        "/v1/cluster/nodes/{id}": {
            "parameters": [
                {"name": "id", "in": "path", "required": True, "schema": rule_name},
            ],
            "delete": {
                "summary": "Remove a node, moving its keys to the others first (admin)",
                "security": admin,
                "parameters": [
                    {
                        "name": "dry_run",
                        "in": "query",
                        "required": False,
                        "schema": {"enum": ["1", "true", "0", "false"]},
                    }
                ],
                "responses": _responses(
                    {
                        "200": {"description": "dry_run: the planned moves"},
                        "202": {"description": "migration started"},
                    },
                    400,
                    401,
                    404,
                    409,
                    503,
                ),
            },
        },
        "/v1/cluster/migration/resume": {
            "post": {
                "summary": "Resume a paused migration (admin)",
                "security": admin,
                "responses": _responses({"202": {"description": "resumed"}}, 401, 409),
            }
        },
        "/v1/cluster/migration/abort": {
            "post": {
                "summary": "Undo the running migration: the keys it moved go back to their "
                "previous owners, as a migration of its own (admin)",
                "security": admin,
                "responses": _responses(
                    {"202": {"description": "the revert started"}}, 401, 409, 503
                ),
            }
        },
        "/ui": {
            "get": {
                "summary": "The live cluster page (HTML; its files under /ui/)",
                "responses": {"200": {"description": "text/html"}},
            }
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
                "summary": "Every node ready: reachable, its Redis answering and taking writes",
                "responses": {
                    "200": {"description": "ready"},
                    "503": {"description": "degraded: `why` names each node not ready"},
                },
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
