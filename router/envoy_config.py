"""Envoy rate-limit descriptors: envoyproxy/ratelimit's YAML format -> shardlimit rules.

One file holds one or more YAML documents, one per domain (`---` between them). A
descriptor is matched like envoyproxy/ratelimit does: level by level, `key` + `value`
first, then a wildcard `value` (`*` matches any run of characters), then `key` alone;
a limit applies only when it sits at the depth of the request's last entry.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cluster.model.errors import Problems, ValidationError
from cluster.model.keys import MAX_KEY_BYTES
from cluster.model.limits import MAX_COUNT, LimitSpec, parse_limits
from router.rules import ON_FAILURE, Rule, make_rule
from router.watched_file import WatchedFile

log = logging.getLogger("shardlimit.envoy")

# envoyproxy/ratelimit's units and their fixed, epoch-aligned windows (its UnitToDivider):
# a month is 30 days and a year 365 days there, and here too.
UNIT_MS: dict[str, int] = {
    "second": 1000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "week": 7 * 86_400_000,
    "month": 30 * 86_400_000,
    "year": 365 * 86_400_000,
}
_DESCRIPTOR_FIELDS = {
    "key", "value", "rate_limit", "limits", "rule", "on_failure", "shadow_mode", "descriptors",
    "name", "replaces", "share_threshold", "detailed_metric", "value_to_metric", "quota_mode",
    "metadata",
}  # fmt: skip
# Accepted and without effect here: metrics naming (detailed_metric, value_to_metric), the
# response's dynamic metadata (metadata) and quota_mode (checked as a plain limit).
_RATE_LIMIT_FIELDS = {"unit", "requests_per_unit", "unlimited", "name", "replaces"}
_SCOPE_CHARS = re.compile(r"[^A-Za-z0-9_.:-]")
_KEY_ESCAPES = str.maketrans({"%": "%25", "|": "%7C", "=": "%3D", "{": "%7B", "}": "%7D"})


@dataclass(frozen=True)
class DescriptorLimit:
    """What a matched descriptor applies."""

    scope: str  # the rule name its counters are kept under: one per config path
    rule: Rule | None  # rate_limit / limits; None with rule_ref, unlimited or blocked
    rule_ref: str | None = None  # `rule: NAME`: a cluster rule, looked up per request
    unlimited: bool = False
    blocked: bool = False  # requests_per_unit: 0, every hit is over the limit
    shadow_mode: bool = False
    name: str = ""
    replaces: tuple[str, ...] = ()
    requests_per_unit: int | None = None  # rate_limit form: reported as current_limit
    unit: str | None = None


@dataclass
class Level:
    """One descriptor list: exact key/value entries, wildcard values, key-only ones."""

    exact: dict[tuple[str, str], DescriptorNode] = field(default_factory=dict)
    wildcards: list[DescriptorNode] = field(default_factory=list)
    defaults: dict[str, DescriptorNode] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.exact or self.wildcards or self.defaults)


@dataclass
class DescriptorNode:
    key: str
    value: str | None
    pattern: re.Pattern[str] | None
    share_threshold: bool
    limit: DescriptorLimit | None
    children: Level


@dataclass(frozen=True)
class Match:
    limit: DescriptorLimit
    key: str  # the limit key: domain and the matched entries


def limit_key(domain: str, parts: list[tuple[str, str]]) -> str:
    """`<domain>|<key>=<value>|...` with % | = { } percent-encoded in every part (no
    hash tags, no ambiguity); longer than a limit key may be: `<domain>|sha256:<hex>`."""
    text = "|".join(
        [domain.translate(_KEY_ESCAPES)]
        + [f"{k.translate(_KEY_ESCAPES)}={v.translate(_KEY_ESCAPES)}" for k, v in parts]
    )
    if len(text.encode("utf-8", "surrogatepass")) <= MAX_KEY_BYTES:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{domain.translate(_KEY_ESCAPES)[:400]}|sha256:{digest}"


def scope_name(domain: str, path: list[tuple[str, str | None]]) -> str:
    """A rule name (RULE_NAME) naming one config path: `envoy.<domain>.<12 hex>`."""
    canonical = "\x00".join([domain] + [f"{k}\x01{'' if v is None else v}" for k, v in path])
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"envoy.{_SCOPE_CHARS.sub('_', domain)[:40]}.{digest}"


def _wildcard(value: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in value.split("*")), re.DOTALL)


def _names(value: Any, path: str, problems: Problems) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(item, dict) and isinstance(item.get("name"), str) for item in value
    ):
        problems.add(path, "must be a list of {name: NAME}")
        return ()
    return tuple(str(item["name"]) for item in value)


def _rate_limit(
    data: Any, scope: str, on_failure: str, shadow: bool, path: str, problems: Problems
) -> DescriptorLimit | None:
    if not isinstance(data, dict):
        problems.add(path, "must be a mapping with unit and requests_per_unit (or unlimited)")
        return None
    for extra in sorted(set(data) - _RATE_LIMIT_FIELDS):
        problems.add(f"{path}.{extra}", "unknown field")
    name = data.get("name") or ""
    if not isinstance(name, str):
        problems.add(f"{path}.name", "must be a string")
        name = ""
    replaces = _names(data.get("replaces"), f"{path}.replaces", problems)
    if data.get("unlimited") is True:
        return DescriptorLimit(scope, None, unlimited=True, name=name, replaces=replaces)
    unit = data.get("unit")
    if not isinstance(unit, str) or unit.lower() not in UNIT_MS:
        problems.add(f"{path}.unit", f"must be one of: {', '.join(UNIT_MS)}")
        return None
    unit = unit.lower()
    count = data.get("requests_per_unit")
    if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_COUNT:
        problems.add(f"{path}.requests_per_unit", f"must be an integer from 0 to {MAX_COUNT}")
        return None
    rule = None
    if count > 0:
        spec = LimitSpec("fixed_window", limit=count, window_ms=UNIT_MS[unit])
        rule = make_rule(scope, (spec,), on_failure)
    return DescriptorLimit(
        scope, rule, blocked=count == 0, shadow_mode=shadow, name=name, replaces=replaces,
        requests_per_unit=count, unit=unit,
    )  # fmt: skip


def _descriptor(
    data: Any, domain: str, parent: list[tuple[str, str | None]], path: str, problems: Problems
) -> DescriptorNode | None:
    if not isinstance(data, dict):
        problems.add(path, "must be a mapping with 'key'")
        return None
    for extra in sorted(set(data) - _DESCRIPTOR_FIELDS):
        problems.add(f"{path}.{extra}", "unknown field")
    key, value = data.get("key"), data.get("value")
    if not isinstance(key, str) or not key:
        problems.add(f"{path}.key", "is required: a non-empty string")
        return None
    if value is not None and not isinstance(value, str | int | float):
        problems.add(f"{path}.value", "must be a string")
        return None
    value = None if value is None or value == "" else str(value)
    here = [*parent, (key, value)]
    scope = scope_name(domain, here)
    shadow = data.get("shadow_mode", False) is True
    on_failure = data.get("on_failure", "allow")
    if on_failure not in ON_FAILURE:
        problems.add(f"{path}.on_failure", "must be 'allow' or 'deny'")
    share = data.get("share_threshold", False) is True
    if share and (value is None or "*" not in value):
        problems.add(f"{path}.share_threshold", "needs a wildcard value (one holding '*')")
    forms = [name for name in ("rate_limit", "limits", "rule") if data.get(name) is not None]
    if len(forms) > 1:
        problems.add(path, "give one of rate_limit, limits or rule")
    limit: DescriptorLimit | None = None
    name, replaces = (
        data.get("name") or "",
        _names(data.get("replaces"), f"{path}.replaces", problems),
    )
    if forms == ["rate_limit"]:
        limit = _rate_limit(
            data["rate_limit"], scope, str(on_failure), shadow, f"{path}.rate_limit", problems
        )
    elif forms == ["limits"]:
        specs = parse_limits(data["limits"], f"{path}.limits", problems)
        if specs:
            fail = data.get("on_failure")
            rule = make_rule(scope, specs, fail if fail in ON_FAILURE else None)
            limit = DescriptorLimit(
                scope, rule, shadow_mode=shadow, name=str(name), replaces=replaces
            )
    elif forms == ["rule"]:
        if not isinstance(data["rule"], str):
            problems.add(f"{path}.rule", "must be a rule name")
        else:
            limit = DescriptorLimit(
                scope, None, rule_ref=data["rule"], shadow_mode=shadow, name=str(name),
                replaces=replaces,
            )  # fmt: skip
    children = _level(data.get("descriptors"), domain, here, f"{path}.descriptors", problems)
    pattern = _wildcard(value) if value is not None and "*" in value else None
    return DescriptorNode(key, value, pattern, share, limit, children)


def _level(
    data: Any, domain: str, parent: list[tuple[str, str | None]], path: str, problems: Problems
) -> Level:
    level = Level()
    if data is None:
        return level
    if not isinstance(data, list):
        problems.add(path, "must be a list of descriptors")
        return level
    for index, item in enumerate(data):
        node = _descriptor(item, domain, parent, f"{path}[{index}]", problems)
        if node is None:
            continue
        taken = (
            node.key in level.defaults
            if node.value is None
            else (node.key, node.value) in level.exact
            or any(w.key == node.key and w.value == node.value for w in level.wildcards)
        )
        if taken:
            problems.add(f"{path}[{index}]", "duplicate descriptor (same key and value)")
        elif node.value is None:
            level.defaults[node.key] = node
        elif node.pattern is not None:
            level.wildcards.append(node)
        else:
            level.exact[(node.key, node.value)] = node
    return level


def parse_documents(docs: list[Any]) -> dict[str, Level]:
    """YAML documents (one per domain) -> the descriptor tree of each domain."""
    problems = Problems()
    domains: dict[str, Level] = {}
    for index, doc in enumerate(docs):
        if doc is None:
            continue
        path = f"documents[{index}]"
        if not isinstance(doc, dict):
            problems.add(path, "must be a mapping with 'domain' and 'descriptors'")
            continue
        for extra in sorted(set(doc) - {"domain", "descriptors"}):
            problems.add(f"{path}.{extra}", "unknown field")
        domain = doc.get("domain")
        if not isinstance(domain, str) or not domain:
            problems.add(f"{path}.domain", "is required: a non-empty string")
            continue
        if domain in domains:
            problems.add(f"{path}.domain", f"duplicate domain '{domain}'")
            continue
        domains[domain] = _level(doc.get("descriptors"), domain, [], f"{domain}.descriptors",
                                 problems)  # fmt: skip
    problems.raise_if_any()
    return domains


def parse_text(text: str) -> dict[str, Level]:
    """Raises ValidationError or yaml.YAMLError."""
    return parse_documents(list(yaml.safe_load_all(text)))


def match(domains: dict[str, Level], domain: str, entries: list[tuple[str, str]]) -> Match | None:
    """The limit a descriptor's entries select, as envoyproxy/ratelimit's GetLimit."""
    level = domains.get(domain)
    if level is None:
        return None
    found: DescriptorLimit | None = None
    parts: list[tuple[str, str]] = []
    for index, (key, value) in enumerate(entries):
        node = level.exact.get((key, value))
        shown = value
        if node is None:
            for wildcard in level.wildcards:
                if wildcard.key == key and wildcard.pattern and wildcard.pattern.fullmatch(value):
                    node = wildcard
                    if wildcard.share_threshold and wildcard.value is not None:
                        shown = wildcard.value  # every match shares one counter
                    break
        if node is None:
            node = level.defaults.get(key)
        parts.append((key, shown))
        if node is not None and node.limit is not None and index == len(entries) - 1:
            found = node.limit
        if node is None or not node.children:
            break
        level = node.children
    return None if found is None else Match(found, limit_key(domain, parts))


class EnvoyConfigFile(WatchedFile):
    """The descriptors file, reloaded when its mtime changes; a bad file keeps the
    previous config (logged, counted in reload_errors)."""

    LOAD_ERRORS = (ValidationError, yaml.YAMLError)

    def __init__(self, path: Path | None) -> None:
        super().__init__(path)
        self.domains: dict[str, Level] = {}

    def load(self) -> None:
        """Raises ValidationError, yaml.YAMLError or OSError (a bad or unreadable file)."""
        if self.path is None or not self.path.exists():
            self.domains, self._mtime = {}, None
            return
        mtime = self.path.stat().st_mtime
        try:
            domains = parse_text(self.path.read_text())
        except (ValidationError, yaml.YAMLError) as exc:
            self.reload_errors += 1
            self._mtime = mtime
            log.error("envoy config %s rejected, keeping the previous one: %s", self.path, exc)
            raise
        self.domains, self._mtime = domains, mtime
        self.reloads += 1
