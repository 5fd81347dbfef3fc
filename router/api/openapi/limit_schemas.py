"""The schema of one limit, per algorithm, and of a list of limits: what
cluster.model.limits.parse_limit accepts, as the check bodies and the rules use it."""

from __future__ import annotations

from typing import Any

from cluster.model.calendar import PERIODS
from cluster.model.limits import (
    ALGORITHMS,
    MAX_AMOUNT_SCALE,
    MAX_BUCKET_PERIOD_MS,
    MAX_BUCKET_SIZE,
    MAX_COUNT,
    MAX_LEASE_MS,
    MAX_LEASES,
    MAX_SLIDING_LOG,
)
from router.api.openapi.patterns import (
    DURATION,
    POSITIVE_DECIMAL,
    RATE_PATTERN,
    TIMESTAMP_PATTERN,
    duration_schema,
    timezone_pattern,
)


def count(maximum: int = MAX_COUNT) -> dict[str, Any]:
    return {"type": "integer", "minimum": 1, "maximum": maximum}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [*schema.get("anyOf", [schema]), {"type": "null"}]}


def one_or_both(first: str, second: str) -> dict[str, Any]:
    """`first`, `second` or both given, not null (if/else rather than anyOf, as in
    schemas.py's rule-or-limits)."""
    given = {
        name: {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
        for name in (first, second)
    }
    return {"if": given[first], "else": given[second]}


def _windowed(algorithm: str) -> dict[str, Any]:
    maximum = MAX_SLIDING_LOG if algorithm == "sliding_log" else MAX_COUNT
    return _variant(algorithm, ["limit", "window"], limit=count(maximum), window=DURATION)


def _bucket(algorithm: str) -> dict[str, Any]:
    # Bounded field by field so that rate x period stays below 2**53 (cluster.model.limits).
    size = "burst" if algorithm == "token_bucket" else "capacity"
    return _variant(
        algorithm,
        ["rate", "period"],
        rate=count(MAX_BUCKET_SIZE),
        period=duration_schema(MAX_BUCKET_PERIOD_MS),
        **{size: {**count(MAX_BUCKET_SIZE), "description": "default: rate"}},
    )


_SCALE = {"type": "integer", "minimum": 0, "maximum": MAX_AMOUNT_SCALE, "default": 2}
_MAX_AMOUNT = {
    **nullable(POSITIVE_DECIMAL),
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
        max_count=nullable(count()),
        max_amount=_MAX_AMOUNT,
        amount_scale=_SCALE,
    )
    schema.update(one_or_both("max_count", "max_amount"))
    schema["description"] = "max_count, max_amount or both (not null)"
    return schema


def _quota(algorithm: str) -> dict[str, Any]:
    schema = _variant(
        algorithm,
        [],
        limit=nullable(count()),
        max_amount=_MAX_AMOUNT,
        amount_scale=_SCALE,
        expires_at=nullable(
            {
                "type": "string",
                "pattern": TIMESTAMP_PATTERN,
                "description": "RFC 3339 with an offset; a real date, in the future",
            }
        ),
    )
    schema.update(one_or_both("limit", "max_amount"))
    schema["description"] = "limit, max_amount or both (not null); no window"
    return schema


def _concurrency(algorithm: str) -> dict[str, Any]:
    schema = _variant(
        algorithm, ["limit", "lease"], limit=count(MAX_LEASES), lease=duration_schema(MAX_LEASE_MS)
    )
    schema["description"] = (
        "at most `limit` leases held at once, each living `lease` unless renewed; in a named "
        "rule only (POST /v1/lease/renew and /release name it), not spread, no cache_denials"
    )
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
    "concurrency": _concurrency,
}
# Inline limits (a check's `limits`) take every algorithm but these.
NAMED_ONLY = ("concurrency",)


def limit_variants() -> dict[str, dict[str, Any]]:
    """One schema per algorithm, in cluster/model/algorithms.py's order."""
    return {name: _PARAMETERS[name](name) for name in ALGORITHMS if name in _PARAMETERS}


def limit_of(variants: list[str], description: str) -> dict[str, Any]:
    """One limit of `variants`: a oneOf told apart by `algorithm`."""
    return {
        "description": description,
        "oneOf": [{"$ref": f"#/components/schemas/{name}"} for name in variants],
        "discriminator": {
            "propertyName": "algorithm",
            "mapping": {name: f"#/components/schemas/{name}" for name in variants},
        },
    }


def limits_of(limit: str, description: str) -> dict[str, Any]:
    """A list of `limit` objects or rate strings, or one rate string."""
    rate = {"type": "string", "pattern": RATE_PATTERN}
    items = {"anyOf": [{"$ref": f"#/components/schemas/{limit}"}, rate]}
    listed = {"type": "array", "minItems": 1, "maxItems": 16, "items": items}
    return {"description": description, "anyOf": [listed, rate]}
