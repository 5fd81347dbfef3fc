"""RESPONSE_DYNAMIC_METADATA: the response's dynamic metadata as envoyproxy/ratelimit
builds it (its ratelimitToMetadata): the domain, each descriptor's entries (`key=value`),
override and hits_addend, the request's hits_addend, and the `metadata` of the
descriptors that passed, merged (the first value of a field wins, mappings merge).
Envoy routes on it, e.g. to the service that still has quota."""

from __future__ import annotations

from typing import Any

from google.protobuf import text_format  # type: ignore[import-untyped]


def _merge(into: dict[str, Any], other: dict[str, Any]) -> None:
    for key, value in other.items():
        if key not in into:
            into[key] = value
        elif isinstance(into[key], dict) and isinstance(value, dict):
            _merge(into[key], value)


def _descriptor(descriptor: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"entries": [f"{e.key}={e.value}" for e in descriptor.entries]}
    if descriptor.HasField("limit"):
        out["limit"] = text_format.MessageToString(descriptor.limit, as_one_line=True)
    if descriptor.HasField("hits_addend"):
        out["hitsAddend"] = float(descriptor.hits_addend.value)
    return out


def add_metadata(response: Any, request: Any, passed: list[dict[str, Any] | None]) -> None:
    """`passed`: the metadata of each descriptor that passed (None: it has none)."""
    fields: dict[str, Any] = {
        "domain": request.domain,
        "descriptors": [_descriptor(d) for d in request.descriptors],
    }
    if request.hits_addend:
        fields["hitsAddend"] = float(request.hits_addend)
    merged: dict[str, Any] = {}
    for metadata in passed:
        if metadata:
            _merge(merged, metadata)
    if merged:
        fields["metadata"] = merged
    response.dynamic_metadata.update(fields)
