"""`POST /v1/cluster/nodes`'s body, decoded strictly, as the OpenAPI document states it
(router/api/openapi/paths.py: NEW_NODE): `url` an http(s) URL of scheme, host and port
only (NODE_URL_PATTERN, the one pattern both use), `id` a name, `weight` an integer from 1
to 1000, `dry_run` true or false (not "yes", not a list), nothing else."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

from cluster.model.errors import FieldError
from cluster.model.keys import RULE_NAME, RULE_NAME_TEXT
from cluster.model.nodes import NodeSpec
from cluster.web.problem import invalid

_PORT = "(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
# ECMA 262 and Python alike (no \d, no \s): a host name or address, or [IPv6], a port.
NODE_URL_PATTERN = rf"^https?://([A-Za-z0-9._~-]+|\[[0-9A-Fa-f:.]+\])(:{_PORT})?/?$"
_NODE_URL = re.compile(NODE_URL_PATTERN)
FIELDS = ("url", "id", "weight", "dry_run")


def new_node(body: Any, existing: set[str]) -> tuple[NodeSpec, bool]:
    """(the node to add, whether only to plan it); an id is made up when none is given.
    Raises Problem (400) naming every bad field."""
    if not isinstance(body, dict):
        raise invalid([FieldError("body", "must be an object with 'url'")])
    errors = [FieldError(str(extra), "unknown field") for extra in body if extra not in FIELDS]
    url = body.get("url")
    if not isinstance(url, str) or _NODE_URL.fullmatch(url) is None:
        errors.append(
            FieldError("url", "must be an http(s) URL of a running node: scheme, host, port")
        )
    node_id = body.get("id")
    if node_id is None:
        number = len(existing) + 1
        while f"n{number}" in existing:
            number += 1
        node_id = f"n{number}"
    if not isinstance(node_id, str) or not RULE_NAME.match(node_id):
        errors.append(FieldError("id", f"must be {RULE_NAME_TEXT}"))
    elif node_id in existing:
        errors.append(FieldError("id", f"node {node_id} already exists"))
    weight = body.get("weight", 1)
    if isinstance(weight, float | Decimal) and math.isfinite(weight) and weight == int(weight):
        weight = int(weight)  # 2.0 is an integer to JSON Schema, as to the OpenAPI document
    if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 1000:
        errors.append(FieldError("weight", "must be an integer from 1 to 1000"))
    dry_run = body.get("dry_run", False)
    if not isinstance(dry_run, bool):
        errors.append(FieldError("dry_run", "must be true or false"))
    if errors:
        raise invalid(errors)
    return NodeSpec(str(node_id), str(url).rstrip("/"), int(weight)), dry_run is True
