"""The checks envoyproxy/ratelimit makes on a descriptors document before it reads it
(its config_impl.go: validateYamlKeys, then the typed decode), with its messages.

Keys are checked against one flat list at every depth, as there: a key from the list
is accepted anywhere (and ignored where it means nothing). shardlimit's own descriptor
fields (`limits`, `rule`, `on_failure`) are accepted too; a `limits` list is checked
by the limit parser, `metadata` is free-form.
"""

from __future__ import annotations

from typing import Any

from cluster.model.errors import Problems

UPSTREAM_KEYS = frozenset(
    [
        "domain",
        "key",
        "value",
        "descriptors",
        "rate_limit",
        "unit",
        "requests_per_unit",
        "unlimited",
        "shadow_mode",
        "quota_mode",
        "name",
        "replaces",
        "detailed_metric",
        "value_to_metric",
        "share_threshold",
        "metadata",
    ]
)
SHARDLIMIT_KEYS = frozenset({"limits", "rule", "on_failure"})
_OPAQUE = frozenset({"metadata", "limits"})
MAX_UINT32 = 2**32 - 1


def check_keys(doc: dict[Any, Any], path: str, problems: Problems) -> None:
    """validateYamlKeys: string keys from the known list, lists of mappings only, and
    leaves that are strings, integers, booleans or empty."""
    for key, value in doc.items():
        if not isinstance(key, str):
            problems.add(path, f"config error, key is not of type string: {key}")
            continue
        if key not in UPSTREAM_KEYS and key not in SHARDLIMIT_KEYS:
            problems.add(f"{path}.{key}", f"config error, unknown key '{key}'")
            continue
        if key in _OPAQUE:
            continue
        here = f"{path}.{key}"
        if isinstance(value, list):
            for index, item in enumerate(value):
                if not isinstance(item, dict):
                    problems.add(
                        f"{here}[{index}]",
                        f"config error, yaml file contains list of type other than map: {item}",
                    )
                else:
                    check_keys(item, f"{here}[{index}]", problems)
        elif isinstance(value, dict):
            check_keys(value, here, problems)
        elif value is not None and not isinstance(value, str | int):  # bool is an int
            # Upstream's message, then what it leaves the reader to guess.
            kind = "a float" if isinstance(value, float) else f"of type {type(value).__name__}"
            problems.add(
                here,
                f"error checking config: {value!r} is {kind}; a value here must be a "
                "string, an integer or a boolean",
            )


def text(data: dict[str, Any], field: str, path: str, problems: Problems) -> str:
    """A string field as Go's YAML decoder fills it: absent or null is "", a number or
    boolean its text; a list or mapping is refused."""
    value = data.get(field)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int):
        return str(value)
    problems.add(f"{path}.{field}", "must be a string")
    return ""


def flag(data: dict[str, Any], field: str, path: str, problems: Problems) -> bool:
    value = data.get(field)
    if value is None:
        return False
    if not isinstance(value, bool):
        problems.add(f"{path}.{field}", "must be true or false")
        return False
    return value


def count(data: dict[str, Any], field: str, path: str, problems: Problems) -> int:
    """requests_per_unit: an unsigned 32-bit integer, absent is 0."""
    value = data.get(field)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_UINT32:
        problems.add(f"{path}.{field}", f"must be an integer from 0 to {MAX_UINT32}")
        return 0
    return value


def mapping(data: dict[str, Any], field: str, path: str, problems: Problems) -> dict[str, Any]:
    value = data.get(field)
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.add(f"{path}.{field}", "must be a mapping")
        return {}
    return value


def items(data: dict[str, Any], field: str, path: str, problems: Problems) -> list[Any]:
    value = data.get(field)
    if value is None:
        return []
    if not isinstance(value, list):
        problems.add(f"{path}.{field}", "must be a list")
        return []
    return value


def metadata(data: Any, path: str, problems: Problems) -> dict[str, Any] | None:
    """A descriptor's `metadata` as a JSON-like mapping (keys as text); None if absent."""
    if data is None:
        return None
    if not isinstance(data, dict):
        problems.add(path, "error parsing metadata: must be a mapping")
        return None
    try:
        return {str(k): _plain(v) for k, v in data.items()}
    except TypeError as exc:
        problems.add(path, f"error parsing metadata: {exc}")
        return None


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, str | bool | int | float):
        return value
    raise TypeError(f"invalid type: {type(value).__name__}")
